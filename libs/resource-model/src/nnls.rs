//! Non-negative least squares by Lawson and Hanson's active-set method ("Solving Least
//! Squares Problems", 1974, ch. 23): `min |Ax - b|` subject to `x >= 0`, for the few
//! columns a resource model has. The unconstrained subproblems are solved by Householder
//! QR on the passive columns, scaled to unit norm first (the model's features differ by
//! orders of magnitude).

/// A dense matrix, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    values: Vec<f64>,
}

impl Matrix {
    /// `rows` of equal length; None when they are empty or ragged.
    pub fn from_rows(rows: &[Vec<f64>]) -> Option<Self> {
        let cols = rows.first()?.len();
        if cols == 0 || rows.iter().any(|r| r.len() != cols) {
            return None;
        }
        Some(Self {
            rows: rows.len(),
            cols,
            values: rows.concat(),
        })
    }

    fn at(&self, row: usize, col: usize) -> f64 {
        self.values[row * self.cols + col]
    }

    /// `A x`.
    pub fn times(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .map(|r| (0..self.cols).map(|c| self.at(r, c) * x[c]).sum())
            .collect()
    }

    /// `Aᵀ v`.
    fn transposed_times(&self, v: &[f64]) -> Vec<f64> {
        (0..self.cols)
            .map(|c| (0..self.rows).map(|r| self.at(r, c) * v[r]).sum())
            .collect()
    }
}

/// The x >= 0 minimising `|Ax - b|` (`b` has one value per row of `a`).
pub fn nnls(a: &Matrix, b: &[f64]) -> Vec<f64> {
    let n = a.cols;
    let scale: Vec<f64> = (0..n)
        .map(|c| {
            let norm = (0..a.rows).map(|r| a.at(r, c).powi(2)).sum::<f64>().sqrt();
            if norm > 0.0 { norm } else { 1.0 }
        })
        .collect();
    let scaled = Matrix {
        values: (0..a.rows * n)
            .map(|i| a.values[i] / scale[i % n])
            .collect(),
        ..a.clone()
    };
    let x = active_set(&scaled, b);
    x.iter().zip(&scale).map(|(x, s)| x / s).collect()
}

/// Lawson-Hanson on columns of unit norm.
fn active_set(a: &Matrix, b: &[f64]) -> Vec<f64> {
    let n = a.cols;
    let tolerance = 1e-10 * b.iter().map(|v| v.abs()).fold(1.0, f64::max) * a.rows as f64;
    let mut x = vec![0.0; n];
    let mut passive = vec![false; n];
    // Each outer step frees one column; 3n of them is far beyond what converging needs.
    for _ in 0..3 * n {
        let gradient = a.transposed_times(&residual(a, &x, b));
        let Some(entering) = (0..n)
            .filter(|&j| !passive[j] && gradient[j] > tolerance)
            .max_by(|&i, &j| gradient[i].total_cmp(&gradient[j]))
        else {
            break;
        };
        passive[entering] = true;
        // Each pass drops at least one column from the passive set.
        for _ in 0..=n {
            let s = least_squares_on(a, b, &passive);
            if (0..n).all(|j| !passive[j] || s[j] > 0.0) {
                x = s;
                break;
            }
            // Step from x toward s as far as feasibility allows; the columns that reach
            // zero leave the passive set.
            let step = (0..n)
                .filter(|&j| passive[j] && s[j] <= 0.0)
                .map(|j| {
                    let gap = x[j] - s[j];
                    if gap > 0.0 { x[j] / gap } else { 0.0 }
                })
                .fold(1.0, f64::min);
            for j in 0..n {
                x[j] += step * (s[j] - x[j]);
                if passive[j] && x[j] <= tolerance {
                    passive[j] = false;
                    x[j] = 0.0;
                }
            }
        }
    }
    x
}

fn residual(a: &Matrix, x: &[f64], b: &[f64]) -> Vec<f64> {
    a.times(x).iter().zip(b).map(|(ax, b)| b - ax).collect()
}

/// The unconstrained least-squares solution on the `passive` columns (zero elsewhere).
fn least_squares_on(a: &Matrix, b: &[f64], passive: &[bool]) -> Vec<f64> {
    let columns: Vec<usize> = (0..a.cols).filter(|&j| passive[j]).collect();
    let mut solution = vec![0.0; a.cols];
    let sub: Vec<Vec<f64>> = columns
        .iter()
        .map(|&c| (0..a.rows).map(|r| a.at(r, c)).collect())
        .collect();
    for (value, &c) in householder_solve(sub, b.to_vec()).iter().zip(&columns) {
        solution[c] = *value;
    }
    solution
}

/// Least squares `min |Mx - y|` by Householder QR, `m` given as its columns (each as long
/// as `y`); a column dependent on the ones before it gets 0.
fn householder_solve(mut m: Vec<Vec<f64>>, mut y: Vec<f64>) -> Vec<f64> {
    let (rows, k) = (y.len(), m.len());
    let steps = k.min(rows);
    for step in 0..steps {
        let norm = m[step][step..].iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm < 1e-300 {
            continue;
        }
        let alpha = if m[step][step] > 0.0 { -norm } else { norm };
        let mut v = m[step][step..].to_vec();
        v[0] -= alpha;
        let v_norm2: f64 = v.iter().map(|x| x * x).sum();
        if v_norm2 < 1e-300 {
            continue;
        }
        let reflect = |target: &mut [f64]| {
            let dot: f64 = v.iter().zip(target.iter()).map(|(a, b)| a * b).sum();
            let f = 2.0 * dot / v_norm2;
            for (t, v) in target.iter_mut().zip(&v) {
                *t -= f * v;
            }
        };
        for column in &mut m[step..] {
            reflect(&mut column[step..]);
        }
        reflect(&mut y[step..]);
    }
    // Back substitution on R (upper triangular, `steps` rows).
    let mut x = vec![0.0; k];
    for step in (0..steps).rev() {
        let rest: f64 = (step + 1..k).map(|c| m[c][step] * x[c]).sum();
        x[step] = if m[step][step].abs() > 1e-12 {
            (y[step] - rest) / m[step][step]
        } else {
            0.0
        };
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: &[&[f64]]) -> Matrix {
        Matrix::from_rows(&rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>()).expect("matrix")
    }

    fn close(a: &[f64], b: &[f64], tolerance: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tolerance)
    }

    #[test]
    #[expect(
        clippy::approx_constant,
        reason = "MATLAB's documented example matrix, digit for digit"
    )]
    fn matlab_lsqnonneg_example() {
        // MATLAB's lsqnonneg documentation: the unconstrained solution is (-2.5627, 3.1108),
        // the non-negative one (0, 0.6929).
        let c = matrix(&[
            &[0.0372, 0.2869],
            &[0.6861, 0.7071],
            &[0.6233, 0.6245],
            &[0.6344, 0.6170],
        ]);
        let d = [0.8587, 0.1781, 0.0747, 0.8405];
        let x = nnls(&c, &d);
        assert!(close(&x, &[0.0, 0.6929], 1e-4), "{x:?}");
        let unconstrained = householder_solve(
            vec![
                vec![0.0372, 0.6861, 0.6233, 0.6344],
                vec![0.2869, 0.7071, 0.6245, 0.6170],
            ],
            d.to_vec(),
        );
        assert!(
            close(&unconstrained, &[-2.5627, 3.1108], 1e-4),
            "{unconstrained:?}"
        );
    }

    #[test]
    fn scipy_nnls_example() {
        // scipy.optimize.nnls's documentation: x = (1.5, 1.0).
        let a = matrix(&[&[1.0, 0.0], &[1.0, 0.0], &[0.0, 1.0]]);
        assert!(close(&nnls(&a, &[2.0, 1.0, 1.0]), &[1.5, 1.0], 1e-12));
        // And with b pointing away from every column: x = 0.
        assert!(close(&nnls(&a, &[-1.0, -1.0, -1.0]), &[0.0, 0.0], 1e-12));
    }

    #[test]
    fn random_problems_meet_the_kkt_conditions() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        for _ in 0..200 {
            let (rows, cols) = (8, 5);
            let a: Vec<Vec<f64>> = (0..rows)
                .map(|_| (0..cols).map(|_| next()).collect())
                .collect();
            let b: Vec<f64> = (0..rows).map(|_| next()).collect();
            let a = Matrix::from_rows(&a).expect("matrix");
            let x = nnls(&a, &b);
            let gradient = a.transposed_times(&residual(&a, &x, &b));
            for j in 0..cols {
                // Feasible; no column could lower the residual by growing; the ones in use
                // are at a stationary point.
                assert!(x[j] >= 0.0, "{x:?}");
                assert!(gradient[j] <= 1e-9, "{gradient:?} at {x:?}");
                if x[j] > 0.0 {
                    assert!(gradient[j].abs() <= 1e-9, "{gradient:?} at {x:?}");
                }
            }
        }
    }

    #[test]
    fn columns_of_very_different_scales_are_recovered() {
        // Features spanning nine orders of magnitude, as the model's do.
        let truth = [2.0e-6, 3.0, 4.0e3];
        let rows: Vec<Vec<f64>> = (1..=12)
            .map(|i| {
                let i = f64::from(i);
                vec![1.0e5 * i, 0.5 + (i * 0.7).sin().abs(), 1.0e-3 / i]
            })
            .collect();
        let b: Vec<f64> = rows
            .iter()
            .map(|r| r.iter().zip(&truth).map(|(x, t)| x * t).sum())
            .collect();
        let x = nnls(&Matrix::from_rows(&rows).expect("matrix"), &b);
        for (x, t) in x.iter().zip(&truth) {
            assert!((x - t).abs() <= 1e-6 * t, "{x} vs {t}");
        }
    }
}
