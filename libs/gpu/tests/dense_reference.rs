//! Without a GPU: the dense launches' CPU reference (what the GPU checks compare against)
//! computes what a dense network needs: known products and interactions, backward passes
//! that are the adjoints of their forwards, head gradients that are the losses' slopes.

mod common;

use common::random_floats;
use primus_gpu::dense::{DotShape, FmShape, HeadLoss, Product, Stored, reference};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
        .collect()
}

fn inner(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum()
}

#[test]
fn a_product_is_the_same_whichever_way_its_operands_are_stored() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2 x 3
    let b = [1.0, 0.0, 0.0, 1.0, 2.0, -1.0]; // 3 x 2
    let mut want = [0.0; 4];
    reference::matmul(&mut want, &a, &b, Product::new([2, 3, 2]));
    assert_eq!(want, [7.0, -1.0, 16.0, -1.0]);
    let (at, bt) = (transpose(&a, 2, 3), transpose(&b, 3, 2));
    for (a, a_stored) in [(&a[..], Stored::AsIs), (&at[..], Stored::Transposed)] {
        for (b, b_stored) in [(&b[..], Stored::AsIs), (&bt[..], Stored::Transposed)] {
            let mut got = [1.0; 4];
            let product = Product::new([2, 3, 2]).a(a_stored).b(b_stored);
            reference::matmul(&mut got, a, b, product.accumulate(true));
            assert_eq!(got, want.map(|v| v + 1.0), "{product:?}");
        }
    }
}

#[test]
fn dots_of_known_vectors_and_the_column_sums_of_a_known_matrix() {
    let shape = DotShape {
        rows: 1,
        dim: 2,
        vectors: 3,
    };
    let mut out = vec![0.0; shape.width()];
    reference::dots_forward(&[1.0, 2.0], &[3.0, 4.0, 5.0, 6.0], shape, &mut out);
    assert_eq!(out, [1.0, 2.0, 11.0, 17.0, 39.0]);
    assert_eq!(
        reference::column_sums(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3),
        [5.0, 7.0, 9.0]
    );
}

/// The interaction is bilinear, so a central difference along any direction is its
/// derivative up to rounding: `<g, f(x + εd) - f(x - εd)> / 2ε = <backward(g), d>`.
#[test]
fn the_dots_backward_is_the_adjoint_of_the_forward() {
    let mut rng = StdRng::seed_from_u64(7);
    let shape = DotShape {
        rows: 5,
        dim: 4,
        vectors: 6,
    };
    let first_len = shape.rows * shape.dim;
    let x = random_floats(
        &mut rng,
        first_len + shape.rows * (shape.vectors - 1) * shape.dim,
    );
    let d = random_floats(&mut rng, x.len());
    let g = random_floats(&mut rng, shape.rows * shape.width());
    let forward = |x: &[f32]| {
        let mut out = vec![0.0; shape.rows * shape.width()];
        reference::dots_forward(&x[..first_len], &x[first_len..], shape, &mut out);
        inner(&g, &out)
    };
    let eps = 1e-2f32;
    let shifted =
        |sign: f32| -> Vec<f32> { x.iter().zip(&d).map(|(x, d)| x + sign * eps * d).collect() };
    let slope = (forward(&shifted(1.0)) - forward(&shifted(-1.0))) / (2.0 * f64::from(eps));
    let (mut grad_first, mut grad_rest) = (vec![0.0; first_len], vec![0.0; x.len() - first_len]);
    reference::dots_backward(
        (&x[..first_len], &x[first_len..]),
        &g,
        shape,
        (&mut grad_first, false),
        (&mut grad_rest, false),
    );
    let adjoint = inner(&grad_first, &d[..first_len]) + inner(&grad_rest, &d[first_len..]);
    assert!(
        (slope - adjoint).abs() <= 1e-3 * adjoint.abs().max(1.0),
        "slope {slope} against the backward's {adjoint}"
    );
}

#[test]
fn a_heads_gradient_is_the_slope_of_its_weighted_mean_loss() {
    let mut rng = StdRng::seed_from_u64(8);
    let rows = 64;
    let values: Vec<f32> = random_floats(&mut rng, rows)
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    let labels: Vec<f32> = random_floats(&mut rng, rows)
        .iter()
        .map(|v| f32::from(*v > 0.0))
        .collect();
    for loss in [HeadLoss::BinaryCrossEntropy, HeadLoss::SquaredError] {
        let weight = 0.5;
        let mean_loss = |values: &[f32]| {
            let mut grad = vec![0.0; rows];
            let (_, losses) =
                reference::head_loss(values, &labels, loss, weight, (&mut grad, false));
            f64::from(weight) * losses.iter().map(|l| f64::from(*l)).sum::<f64>() / rows as f64
        };
        let mut grad = vec![0.0; rows];
        let (predictions, _) =
            reference::head_loss(&values, &labels, loss, weight, (&mut grad, false));
        assert!(predictions.iter().all(|p| p.is_finite()));
        for row in [0, 17, rows - 1] {
            let eps = 1e-2f32;
            let mut up = values.clone();
            up[row] += eps;
            let mut down = values.clone();
            down[row] -= eps;
            let slope = (mean_loss(&up) - mean_loss(&down)) / (2.0 * f64::from(eps));
            let got = f64::from(grad[row]);
            assert!(
                (slope - got).abs() <= 1e-3 * got.abs().max(1e-3),
                "{loss:?} row {row}: slope {slope}, gradient {got}"
            );
        }
    }
}

/// The FM term is quadratic: a central difference along any direction is its derivative.
#[test]
fn the_fm_backward_is_the_adjoint_of_the_forward() {
    let mut rng = StdRng::seed_from_u64(9);
    let shape = FmShape {
        rows: 4,
        vectors: 5,
        dim: 3,
    };
    let e = random_floats(&mut rng, shape.rows * shape.width());
    let d = random_floats(&mut rng, e.len());
    let g = random_floats(&mut rng, shape.rows);
    let forward = |e: &[f32]| {
        let mut out = vec![0.0; shape.rows];
        reference::fm_forward(e, shape, &mut out);
        inner(&g, &out)
    };
    let eps = 1e-2f32;
    let shifted =
        |sign: f32| -> Vec<f32> { e.iter().zip(&d).map(|(e, d)| e + sign * eps * d).collect() };
    let slope = (forward(&shifted(1.0)) - forward(&shifted(-1.0))) / (2.0 * f64::from(eps));
    let mut grad = vec![0.0; e.len()];
    reference::fm_backward(&e, &g, shape, (&mut grad, false));
    let adjoint = inner(&grad, &d);
    assert!(
        (slope - adjoint).abs() <= 1e-3 * adjoint.abs().max(1.0),
        "slope {slope} against the backward's {adjoint}"
    );
    let mut known = [0.0];
    let one_row = FmShape {
        rows: 1,
        vectors: 2,
        dim: 2,
    };
    reference::fm_forward(&[1.0, 2.0, 3.0, 4.0], one_row, &mut known);
    assert_eq!(known, [11.0], "the pair's dot product, 1*3 + 2*4");
}
