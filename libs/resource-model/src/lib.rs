//! DLRover-RM's resource-performance model (§4.1, Eqs. 1-6): a training Job's iteration
//! time as a function of its allocation, and its fit to the iterations the Job ran; its
//! warm start ([`warm_start`], Alg. 1): a new Job's first allocation from similar finished
//! Jobs; its auto-scaling plans ([`plans`]: NSGA-II per Job, weighted greedy across
//! Jobs); and one Job's auto-scaling step from what it measured ([`autoscale`]), which the
//! master and the cluster simulator both run.
//!
//! Owns the model's form, its fitting, the warm-start arithmetic and the scaling
//! decisions; where the config DB lives and how an allocation is applied is the master's. With `w`
//! trainers of `λw` cores, `p` PS shards of `λp` cores, minibatch `m`, dense model `M`
//! bytes, embedding width `D` and bandwidth `B`:
//!
//! `T_iter = α_grad·m/λw + α_upd·w/(p·λp) + α_sync·(M/p)/(B/w) + α_emb·m·D/p + β`,
//! throughput `w·m / T_iter` samples/s. The four betas of the paper add into one `β`: no
//! observation can tell them apart. The coefficients are non-negative and fitted by
//! non-negative least squares ([`nnls`], Lawson-Hanson) on relative error, each row
//! weighted by its observed time, which is the root mean squared logarithmic error
//! (RMSLE) the paper minimises to first order; [`FittedModel::rmsle`] reports the exact one.

#![warn(missing_docs)]

pub mod autoscale;
pub mod nnls;
pub mod plans;
pub mod warm_start;

use nnls::Matrix;

/// What a Job is, for the model: constant while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobShape {
    /// Samples per trainer per iteration (`m`).
    pub batch: f64,
    /// Bytes of dense parameters a trainer pulls and pushes each iteration (`M`).
    pub model_bytes: f64,
    /// Embedding floats looked up per sample, summed over features (`D`).
    pub embedding_width: f64,
    /// Network bandwidth per trainer, bytes/s (`B`).
    pub bandwidth: f64,
}

/// How many processes of each role run, with how many cores each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    /// Trainers (`w`).
    pub trainers: u32,
    /// PS shards (`p`).
    pub ps: u32,
    /// Cores per trainer (`λw`).
    pub trainer_cpu: f64,
    /// Cores per PS shard (`λp`).
    pub ps_cpu: f64,
}

impl Allocation {
    /// `trainers` trainers and `ps` PS shards of one core each.
    pub const fn one_core_each(trainers: u32, ps: u32) -> Self {
        Self {
            trainers,
            ps,
            trainer_cpu: 1.0,
            ps_cpu: 1.0,
        }
    }
}

/// One measured iteration time under an allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The allocation it ran under.
    pub allocation: Allocation,
    /// Seconds per iteration (one minibatch on every trainer).
    pub iteration_seconds: f64,
}

/// The fitted coefficients, each non-negative (seconds per unit of its term).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Coefficients {
    /// Gradient computation, per sample per trainer core.
    pub grad: f64,
    /// Parameter update on the PS, per trainer per PS core.
    pub update: f64,
    /// Dense parameter synchronisation, per (bytes per shard / bandwidth per trainer).
    pub sync: f64,
    /// Embedding lookups, per looked-up float per shard.
    pub embedding: f64,
    /// What does not scale with the allocation (the paper's betas together).
    pub base: f64,
}

/// Input the model cannot use; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// A field that must be a finite positive number is not.
    #[error("{field}: {value} is not a finite number > 0")]
    NotPositive {
        /// The field.
        field: String,
        /// Its value.
        value: f64,
    },
    /// Nothing to fit.
    #[error("observations: at least one is needed to fit the model")]
    NoObservations,
}

/// Which of the model's terms a fit may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terms {
    /// Eqs. 1-3 (gradient computation, parameter update and the constant): a model of the
    /// computation alone, which knows nothing of dense synchronisation or lookups.
    Compute,
    /// Eqs. 1-5.
    All,
}

/// The model of one Job with its fitted coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FittedModel {
    /// The Job.
    pub shape: JobShape,
    /// The fit.
    pub coefficients: Coefficients,
}

impl FittedModel {
    /// Fits the coefficients to `observations` of the Job `shape`.
    pub fn fit(shape: JobShape, observations: &[Observation]) -> Result<Self, ModelError> {
        Self::fit_terms(shape, observations, Terms::All)
    }

    /// [`FittedModel::fit`] with only `used` terms; the others' coefficients are zero.
    pub fn fit_terms(
        shape: JobShape,
        observations: &[Observation],
        used: Terms,
    ) -> Result<Self, ModelError> {
        check_shape(&shape)?;
        if observations.is_empty() {
            return Err(ModelError::NoObservations);
        }
        let mut rows = Vec::with_capacity(observations.len());
        let mut ones = Vec::with_capacity(observations.len());
        for (i, observation) in observations.iter().enumerate() {
            let at = format!("observations[{i}]");
            check_allocation(&observation.allocation, &at)?;
            let seconds = observation.iteration_seconds;
            positive(&format!("{at}.iteration_seconds"), seconds)?;
            // Relative error: each row divided by its observed time, against 1.
            let mut row = terms(&shape, &observation.allocation).map(|t| t / seconds);
            if used == Terms::Compute {
                // A zero column never enters the fit: its coefficient stays zero.
                (row[2], row[3]) = (0.0, 0.0);
            }
            rows.push(row.to_vec());
            ones.push(1.0);
        }
        let matrix = Matrix::from_rows(&rows).ok_or(ModelError::NoObservations)?;
        let [grad, update, sync, embedding, base] = match nnls::nnls(&matrix, &ones)[..] {
            [a, b, c, d, e] => [a, b, c, d, e],
            _ => unreachable!("five terms, five coefficients"),
        };
        Ok(Self {
            shape,
            coefficients: Coefficients {
                grad,
                update,
                sync,
                embedding,
                base,
            },
        })
    }

    /// Predicted seconds per iteration under `allocation`.
    pub fn iteration_seconds(&self, allocation: &Allocation) -> Result<f64, ModelError> {
        check_allocation(allocation, "allocation")?;
        let c = &self.coefficients;
        let weights = [c.grad, c.update, c.sync, c.embedding, c.base];
        Ok(terms(&self.shape, allocation)
            .iter()
            .zip(weights)
            .map(|(t, w)| t * w)
            .sum())
    }

    /// Predicted samples per second under `allocation` (Eq. 1); 0 when the fit explains
    /// no time at all.
    pub fn throughput(&self, allocation: &Allocation) -> Result<f64, ModelError> {
        let seconds = self.iteration_seconds(allocation)?;
        let samples = f64::from(allocation.trainers) * self.shape.batch;
        Ok(if seconds > 0.0 {
            samples / seconds
        } else {
            0.0
        })
    }

    /// Root mean squared logarithmic error of the predicted iteration times against
    /// `observations`.
    pub fn rmsle(&self, observations: &[Observation]) -> Result<f64, ModelError> {
        if observations.is_empty() {
            return Err(ModelError::NoObservations);
        }
        let mut sum = 0.0;
        for observation in observations {
            let predicted = self.iteration_seconds(&observation.allocation)?;
            sum += (predicted.ln_1p() - observation.iteration_seconds.ln_1p()).powi(2);
        }
        Ok((sum / observations.len() as f64).sqrt())
    }
}

/// Each coefficient's term under `a`: Eqs. 2-5 and the constant.
fn terms(shape: &JobShape, a: &Allocation) -> [f64; 5] {
    let (w, p) = (f64::from(a.trainers), f64::from(a.ps));
    [
        shape.batch / a.trainer_cpu,
        w / (p * a.ps_cpu),
        (shape.model_bytes / p) / (shape.bandwidth / w),
        shape.batch * shape.embedding_width / p,
        1.0,
    ]
}

fn positive(field: &str, value: f64) -> Result<(), ModelError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ModelError::NotPositive {
            field: field.to_owned(),
            value,
        })
    }
}

fn check_shape(shape: &JobShape) -> Result<(), ModelError> {
    positive("shape.batch", shape.batch)?;
    positive("shape.model_bytes", shape.model_bytes)?;
    positive("shape.embedding_width", shape.embedding_width)?;
    positive("shape.bandwidth", shape.bandwidth)
}

fn check_allocation(a: &Allocation, at: &str) -> Result<(), ModelError> {
    positive(&format!("{at}.trainers"), f64::from(a.trainers))?;
    positive(&format!("{at}.ps"), f64::from(a.ps))?;
    positive(&format!("{at}.trainer_cpu"), a.trainer_cpu)?;
    positive(&format!("{at}.ps_cpu"), a.ps_cpu)
}
