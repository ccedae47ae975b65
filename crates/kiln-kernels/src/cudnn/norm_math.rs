//! Batch normalization's training passes in burn's operations, generic over the backend: what
//! runs on CUDA where a cuDNN call fails (on cubecl's kernels), and the arithmetic cuDNN's
//! `cudnnBatchNormalization{ForwardTraining,Backward}` is checked against. Tested on the CPU.

use burn::tensor::{Tensor, backend::Backend};

/// What the forward pass hands on, all per channel (`[C]`) but `y`: cuDNN's outputs.
pub(crate) struct Forward<B: Backend> {
    pub y: Tensor<B, 4>,
    pub mean: Tensor<B, 1>,
    /// `1 / sqrt(var + eps)`, with the biased batch variance.
    pub inv_std: Tensor<B, 1>,
    /// The unbiased batch variance (`n / (n - 1)` times the biased one), for the running one.
    pub unbiased_var: Tensor<B, 1>,
}

/// `(x - mean) * inv_std * weight + bias` per channel, with the batch's mean and biased variance
/// over `N`, `H` and `W` (two passes: the variance from the centered values).
pub(crate) fn forward<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> Forward<B> {
    let count = per_channel_count(&x);
    let mean = per_channel_sum(x.clone()) / count;
    let centered = x - per_channel(mean.clone());
    let var = per_channel_sum(centered.clone().square()) / count;
    let inv_std = (var.clone() + eps).sqrt().recip();
    let y = centered * per_channel(weight * inv_std.clone()) + per_channel(bias);
    let unbiased_var = var * (count / (count - 1.0).max(1.0));
    Forward {
        y,
        mean,
        inv_std,
        unbiased_var,
    }
}

/// The gradients of `x`, `weight` and `bias` (in that order) from the output's `dy`, with the
/// forward pass's `mean` and `inv_std`:
/// `dx = weight * inv_std * (dy - mean(dy) - x_hat * mean(dy * x_hat))` per channel.
pub(crate) fn backward<B: Backend>(
    x: Tensor<B, 4>,
    dy: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    mean: Tensor<B, 1>,
    inv_std: Tensor<B, 1>,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let count = per_channel_count(&x);
    let x_hat = (x - per_channel(mean)) * per_channel(inv_std.clone());
    let dbias = per_channel_sum(dy.clone());
    let dweight = per_channel_sum(dy.clone() * x_hat.clone());
    let dx =
        (dy - per_channel(dbias.clone() / count) - x_hat * per_channel(dweight.clone() / count))
            * per_channel(weight * inv_std);
    (dx, dweight, dbias)
}

fn per_channel_count<B: Backend>(x: &Tensor<B, 4>) -> f64 {
    let [n, _, h, w] = x.dims();
    (n * h * w) as f64
}

/// The sum over `N`, `H` and `W`, as `[C]`.
fn per_channel_sum<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 1> {
    let c = x.dims()[1];
    x.sum_dim(0).sum_dim(2).sum_dim(3).reshape([c])
}

/// `[C]` as `[1, C, 1, 1]`, to broadcast over an NCHW tensor.
fn per_channel<B: Backend>(values: Tensor<B, 1>) -> Tensor<B, 4> {
    let c = values.dims()[0];
    values.reshape([1, c, 1, 1])
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tolerance};

    use super::*;

    type Train = Autodiff<Flex>;

    /// Batch norm as the textbook writes it, over `[C, N * H * W]` rows, through autodiff.
    fn textbook(
        x: Tensor<Train, 4>,
        weight: Tensor<Train, 1>,
        bias: Tensor<Train, 1>,
        eps: f64,
    ) -> Tensor<Train, 4> {
        let [n, c, h, w] = x.dims();
        let rows = x.swap_dims(0, 1).reshape([c, n * h * w]);
        let mean = rows.clone().mean_dim(1);
        let var = rows.clone().var_bias(1);
        let y = (rows - mean) / (var + eps).sqrt() * weight.reshape([c, 1]) + bias.reshape([c, 1]);
        y.reshape([c, n, h, w]).swap_dims(0, 1)
    }

    fn close<const D: usize>(ours: Tensor<Flex, D>, theirs: Tensor<Flex, D>, what: &str) {
        println!("{what}");
        ours.into_data()
            .assert_approx_eq::<f32>(&theirs.into_data(), Tolerance::rel_abs(1e-4, 1e-5));
    }

    #[test]
    fn the_two_passes_match_autodiff_of_the_textbook_formula() {
        let device = Default::default();
        Train::seed(&device, 7);
        let eps = 1e-5;
        for shape in [[4, 3, 5, 7], [2, 8, 1, 1], [1, 2, 3, 3], [8, 16, 4, 4]] {
            let c = shape[1];
            let x = Tensor::<Train, 4>::random(shape, Distribution::Normal(0.5, 2.0), &device)
                .require_grad();
            let weight = Tensor::<Train, 1>::random([c], Distribution::Uniform(0.5, 1.5), &device)
                .require_grad();
            let bias = Tensor::<Train, 1>::random([c], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            // Every output weighted differently in the loss, so a misplaced gradient shows.
            let dy = Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
            let y = textbook(x.clone(), weight.clone(), bias.clone(), eps);
            let grads = (y.clone() * Tensor::from_inner(dy.clone()))
                .sum()
                .backward();

            let ours = forward(
                x.clone().inner(),
                weight.clone().inner(),
                bias.clone().inner(),
                eps,
            );
            close(ours.y, y.inner(), "y");
            let rows = x
                .clone()
                .inner()
                .swap_dims(0, 1)
                .reshape([c, shape[0] * shape[2] * shape[3]]);
            close(
                ours.mean.clone(),
                rows.clone().mean_dim(1).reshape([c]),
                "mean",
            );
            close(
                ours.unbiased_var,
                rows.clone().var(1).reshape([c]),
                "unbiased variance",
            );
            let inv_std = (rows.var_bias(1).reshape([c]) + eps).sqrt().recip();
            close(ours.inv_std.clone(), inv_std, "inv_std");

            let (dx, dweight, dbias) = backward(
                x.clone().inner(),
                dy,
                weight.clone().inner(),
                ours.mean,
                ours.inv_std,
            );
            close(dx, x.grad(&grads).unwrap(), "dx");
            close(dweight, weight.grad(&grads).unwrap(), "dweight");
            close(dbias, bias.grad(&grads).unwrap(), "dbias");
        }
    }
}
