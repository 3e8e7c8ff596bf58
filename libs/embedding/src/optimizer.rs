//! Per-row optimizers. A row's optimizer state sits right after its weights in the arena,
//! so one update touches one contiguous slice.

use primus_gpu::{RowOptimizer, update_row};
use primus_spec::job::OptimizerSpec;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Optimizer {
    Sgd {
        lr: f32,
    },
    Adagrad {
        lr: f32,
        initial_accumulator: f32,
        epsilon: f32,
    },
    /// State: m[dim], v[dim], beta1^t, beta2^t (bias correction per row).
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        epsilon: f32,
    },
    /// FTRL-proximal. State: z[dim], n[dim]; weights are derived from them on each update.
    Ftrl {
        alpha: f32,
        beta: f32,
        l1: f32,
        l2: f32,
    },
}

impl Optimizer {
    pub(crate) fn from_spec(spec: &OptimizerSpec) -> Self {
        match *spec {
            OptimizerSpec::Sgd { learning_rate } => Self::Sgd {
                lr: learning_rate as f32,
            },
            OptimizerSpec::Adagrad {
                learning_rate,
                initial_accumulator,
                epsilon,
            } => Self::Adagrad {
                lr: learning_rate as f32,
                initial_accumulator: initial_accumulator as f32,
                epsilon: epsilon as f32,
            },
            OptimizerSpec::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => Self::Adam {
                lr: learning_rate as f32,
                beta1: beta1 as f32,
                beta2: beta2 as f32,
                epsilon: epsilon as f32,
            },
            OptimizerSpec::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => Self::Ftrl {
                alpha: alpha as f32,
                beta: beta as f32,
                l1: l1 as f32,
                l2: l2 as f32,
            },
        }
    }

    /// Floats of optimizer state per row.
    pub(crate) fn state_len(&self, dim: usize) -> usize {
        match self {
            Self::Sgd { .. } => 0,
            Self::Adagrad { .. } => dim,
            Self::Adam { .. } => 2 * dim + 2,
            Self::Ftrl { .. } => 2 * dim,
        }
    }

    /// State for a new row whose weights are `weights`.
    pub(crate) fn init_state(&self, weights: &[f32], state: &mut [f32]) {
        match *self {
            Self::Sgd { .. } => {}
            Self::Adagrad {
                initial_accumulator,
                ..
            } => state.fill(initial_accumulator),
            Self::Adam { .. } => {
                let dim = weights.len();
                state[..2 * dim].fill(0.0);
                state[2 * dim] = 1.0;
                state[2 * dim + 1] = 1.0;
            }
            Self::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                // z such that the FTRL weight with n = 0 equals the initial weight.
                let (z, n) = state.split_at_mut(weights.len());
                let denominator = beta / alpha + l2;
                for (z, &w) in z.iter_mut().zip(weights) {
                    *z = if w == 0.0 {
                        0.0
                    } else {
                        -w * denominator - w.signum() * l1
                    };
                }
                n.fill(0.0);
            }
        }
    }

    /// The fused update kernel doing this optimizer's work, where there is one.
    pub(crate) fn kernel(&self) -> Option<RowOptimizer> {
        match *self {
            Self::Adagrad { lr, epsilon, .. } => Some(RowOptimizer::Adagrad { lr, epsilon }),
            Self::Adam {
                lr,
                beta1,
                beta2,
                epsilon,
            } => Some(RowOptimizer::Adam {
                lr,
                beta1,
                beta2,
                epsilon,
            }),
            Self::Sgd { .. } | Self::Ftrl { .. } => None,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::Adagrad { .. } => "adagrad",
            Self::Adam { .. } => "adam",
            Self::Ftrl { .. } => "ftrl",
        }
    }

    /// Applies one gradient to a row.
    #[inline]
    pub(crate) fn apply(&self, weights: &mut [f32], state: &mut [f32], grad: &[f32]) {
        match *self {
            Self::Sgd { lr } => {
                for (w, g) in weights.iter_mut().zip(grad) {
                    *w -= lr * g;
                }
            }
            // The same per-row updates the GPU kernels are checked against (primus-gpu).
            Self::Adagrad { .. } | Self::Adam { .. } => {
                if let Some(kernel) = self.kernel() {
                    update_row(kernel, weights, state, grad);
                }
            }
            Self::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                let (z, n) = state.split_at_mut(weights.len());
                for (((w, z), n), g) in weights.iter_mut().zip(z).zip(n).zip(grad) {
                    let n_new = *n + g * g;
                    let sigma = (n_new.sqrt() - n.sqrt()) / alpha;
                    *z += g - sigma * *w;
                    *n = n_new;
                    *w = if z.abs() <= l1 {
                        0.0
                    } else {
                        -(*z - z.signum() * l1) / ((beta + n.sqrt()) / alpha + l2)
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(optimizer: Optimizer, start: f32, grads: &[f32]) -> f32 {
        let mut weights = [start];
        let mut state = vec![0.0; optimizer.state_len(1)];
        optimizer.init_state(&weights, &mut state);
        for g in grads {
            optimizer.apply(&mut weights, &mut state, &[*g]);
        }
        weights[0]
    }

    #[test]
    fn each_optimizer_moves_against_the_gradient() {
        let optimizers = [
            Optimizer::Sgd { lr: 0.1 },
            Optimizer::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.1,
                epsilon: 1e-8,
            },
            Optimizer::Adam {
                lr: 0.1,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            Optimizer::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
            },
        ];
        for optimizer in optimizers {
            let w = run(optimizer, 0.5, &[1.0, 1.0, 1.0]);
            assert!(w < 0.5, "{optimizer:?}: {w}");
        }
    }

    #[test]
    fn known_values() {
        // SGD: 0.5 - 0.1 * 2 = 0.3.
        assert!((run(Optimizer::Sgd { lr: 0.1 }, 0.5, &[2.0]) - 0.3).abs() < 1e-6);
        // Adagrad: acc = 0.1 + 4 = 4.1; w = 0.5 - 0.1 * 2 / sqrt(4.1).
        let adagrad = Optimizer::Adagrad {
            lr: 0.1,
            initial_accumulator: 0.1,
            epsilon: 0.0,
        };
        let expected = 0.5 - 0.1 * 2.0 / 4.1f32.sqrt();
        assert!((run(adagrad, 0.5, &[2.0]) - expected).abs() < 1e-6);
        // Adam's first step is lr * sign(g) (bias-corrected).
        let adam = Optimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 0.0,
        };
        assert!((run(adam, 0.5, &[3.0]) - 0.49).abs() < 1e-5);
    }

    #[test]
    fn ftrl_state_reproduces_the_initial_weight() {
        let ftrl = Optimizer::Ftrl {
            alpha: 0.05,
            beta: 1.0,
            l1: 0.1,
            l2: 0.01,
        };
        // A zero gradient leaves n at 0, so the derived weight is the initial one.
        for start in [0.3f32, -0.02, 0.0] {
            let w = run(ftrl, start, &[0.0]);
            assert!((w - start).abs() < 1e-6, "{start} -> {w}");
        }
    }
}
