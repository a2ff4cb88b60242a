"""Chain of trust, link 1: the numpy oracle against torch on the CPU (float64).

Conventions: our gradient buffers hold the descent direction, so torch's gradient is
``g = -delta_weights/batch_size``; see docs/fidelity.md for each mapping.
"""
import numpy as np
import pytest

from cukernels import oracle

B = 3          # batch size the accumulators are divided by
STEPS = 6      # optimizer steps per comparison
SHAPE = (7, 5)


def _run(torch, make_opt, ours, rng, states=1):
    """Run torch's optimizer and ours for STEPS steps on the same gradients; compare weights."""
    w0 = rng.standard_normal(SHAPE)
    p = torch.tensor(w0.copy(), requires_grad=True)
    opt = make_opt([p])
    w = w0.copy()
    moments = [np.zeros(SHAPE) for _ in range(states)]
    for step in range(1, STEPS + 1):
        g = rng.standard_normal(SHAPE)
        p.grad = torch.tensor(g)
        opt.step()
        D = -g * B
        ours(D, w, moments, step)
        assert not D.any(), "the update must zero the accumulator"
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-11, atol=1e-13)
    return p, opt, moments


def test_sgd_matches_torch(torch, rng):
    _run(torch, lambda ps: torch.optim.SGD(ps, lr=0.1),
         lambda D, w, m, t: oracle.sgd_update(D, w, B, 0.1), rng, states=0)


def test_sgd_l2_matches_torch_weight_decay(torch, rng):
    # decoupled lr-scaled L2 equals coupled weight decay for plain SGD
    _run(torch, lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.01),
         lambda D, w, m, t: oracle.sgd_update(D, w, B, 0.1, 0.0, 0.01), rng, states=0)


def test_momentum_matches_torch(torch, rng):
    p, opt, (m,) = _run(torch, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0),
                        lambda D, w, m, t: oracle.momentum_update(D, w, m[0], B, 0.05, 0.9), rng)
    buf = opt.state[p]["momentum_buffer"].numpy()
    np.testing.assert_allclose(m, -0.05 * buf, rtol=1e-11, atol=1e-13)


def test_adagrad_matches_torch(torch, rng):
    p, opt, (G,) = _run(torch, lambda ps: torch.optim.Adagrad(ps, lr=0.05, eps=1e-10),
                        lambda D, w, m, t: oracle.adagrad_update(D, w, m[0], B, 0.05), rng)
    np.testing.assert_allclose(G, opt.state[p]["sum"].numpy(), rtol=1e-11, atol=1e-14)


def test_rmsprop_matches_torch(torch, rng):
    p, opt, (G,) = _run(torch, lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-8),
                        lambda D, w, m, t: oracle.rmsprop_update(D, w, m[0], B, 0.01, 0.9), rng)
    np.testing.assert_allclose(G, opt.state[p]["square_avg"].numpy(), rtol=1e-11, atol=1e-14)


def test_adadelta_matches_torch(torch, rng):
    p, opt, (W, G) = _run(
        torch, lambda ps: torch.optim.Adadelta(ps, lr=0.7, rho=0.85, eps=1e-6),
        lambda D, w, m, t: oracle.adadelta_update(D, w, m[0], m[1], B, 0.85, 0.85,
                                                  learning_rate=0.7, eps=1e-6), rng, states=2)
    np.testing.assert_allclose(G, opt.state[p]["square_avg"].numpy(), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(W, opt.state[p]["acc_delta"].numpy(), rtol=1e-10)


def test_adam_matches_torch(torch, rng):
    p, opt, (M, V) = _run(
        torch, lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-8),
        lambda D, w, m, t: oracle.adam_update(D, w, m[0], m[1], B, 0.01, 0.8, 0.95, t=t),
        rng, states=2)
    np.testing.assert_allclose(M, -opt.state[p]["exp_avg"].numpy(), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(V, opt.state[p]["exp_avg_sq"].numpy(), rtol=1e-11, atol=1e-14)


def test_adam_l2_matches_torch_adamw(torch, rng):
    _run(torch, lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-8,
                                              weight_decay=0.05),
         lambda D, w, m, t: oracle.adam_update(D, w, m[0], m[1], B, 0.01, 0.9, 0.99, 0.0, 0.05,
                                               t=t), rng, states=2)


def test_book_adam_matches_adamw_with_rescaled_lr(torch, rng):
    # the book's step equals AdamW's with lr_t = lr*(1-b1^t)*sqrt(1-b2)/((1-b1)*sqrt(1-b2^t))
    lr, b1, b2 = 0.01, 0.9, 0.999
    w0 = rng.standard_normal(SHAPE)
    p = torch.tensor(w0.copy(), requires_grad=True)
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=0.0, weight_decay=0.0)
    w, M, V = w0.copy(), np.zeros(SHAPE), np.zeros(SHAPE)
    for t in range(1, STEPS + 1):
        opt.param_groups[0]["lr"] = lr * (1 - b1**t) * np.sqrt(1 - b2) / ((1 - b1) * np.sqrt(1 - b2**t))
        g = rng.standard_normal(SHAPE)
        p.grad = torch.tensor(g)
        opt.step()
        oracle.adam_update(-g * B, w, M, V, B, lr, b1, b2, variant="book")
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-10)


def test_article_update_weights_is_sgd_momentum_at_batch_one(torch, rng):
    n, i, lr, mom = 4, 6, 0.05, 0.9
    W0 = rng.standard_normal((n, i + 1))
    p = torch.tensor(W0.copy(), requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr, momentum=mom, dampening=0)
    W, dW = W0.copy(), np.zeros_like(W0)
    for _ in range(STEPS):
        x, g = rng.standard_normal(i), rng.standard_normal(n)
        xa = np.append(x, 1.0)
        p.grad = torch.tensor(-np.outer(g, xa))   # g is the descent direction
        opt.step()
        oracle.article_update_weights(W, g, x, dW, lr, mom)
    np.testing.assert_allclose(W, p.detach().numpy(), rtol=1e-11)


# ------------------------------------------------------------------------------ losses
def _neg_grad(torch, loss_fn, t, o):
    ot = torch.tensor(o, requires_grad=True)
    loss_fn(torch.tensor(t), ot).backward()
    return -ot.grad.numpy()


@pytest.mark.parametrize("code,loss", [
    (0, lambda t, o: 0.5 * ((t - o) ** 2).sum()),
    (1, lambda t, o: ((t - o) ** 2).sum()),
    (7, lambda t, o: 0.5 * ((t - o) ** 2).sum()),      # any other code: t - o
])
def test_squared_losses_match_autograd(torch, rng, code, loss):
    t, o = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    np.testing.assert_allclose(oracle.calc_output_gradient(t, o, code),
                               _neg_grad(torch, loss, t, o), rtol=1e-13)


def test_cross_entropy_matches_autograd(torch, rng):
    t, o = rng.uniform(0, 1, (4, 9)), rng.uniform(0.05, 1, (4, 9))
    eps = 1e-7
    want = _neg_grad(torch, lambda t, o: -(t * torch.log(o + eps)).sum(), t, o)
    np.testing.assert_allclose(oracle.calc_output_gradient(t, o, 2, eps=eps), want, rtol=1e-13)


def test_binary_cross_entropy_matches_autograd(torch, rng):
    t, o = rng.uniform(0, 1, (4, 9)), rng.uniform(0.05, 0.95, (4, 9))
    want = _neg_grad(torch, lambda t, o: torch.nn.functional.binary_cross_entropy(
        o, t, reduction="sum"), t, o)
    np.testing.assert_allclose(oracle.calc_output_gradient(t, o, 3, eps=0.0), want, rtol=1e-11, atol=1e-14)


def test_softmax_cross_entropy_chain_gives_t_minus_y(torch, rng):
    z = rng.standard_normal((5, 11))
    t = rng.dirichlet(np.ones(11), size=5)
    y = oracle.softmax_activation(z)
    dz = oracle.softmax_derivative(y, oracle.calc_output_gradient(t, y, 2, eps=0.0))
    zt = torch.tensor(z, requires_grad=True)
    torch.nn.functional.cross_entropy(zt, torch.tensor(t), reduction="sum").backward()
    np.testing.assert_allclose(dz, -zt.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(dz, t - y, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------- activations
def _vjp(torch, f, x, g):
    xt = torch.tensor(x, requires_grad=True)
    y = f(xt)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), xt.grad.numpy()


ACTIVATIONS = {
    "sigmoid": (lambda x: oracle.sigmoid_activation(x, 1.7, 0.4),
                lambda y, g, x: oracle.sigmoid_derivative(y, g, 1.7, 0.4),
                lambda tt, x: 1.7 * tt.sigmoid(x) - 0.4),
    "tanh": (oracle.tanh_activation, lambda y, g, x: oracle.tanh_derivative(y, g),
             lambda tt, x: tt.tanh(x)),
    "lrelu": (lambda x: oracle.lrelu_activation(x, 0.3),
              lambda y, g, x: oracle.lrelu_derivative(y, g, 0.3),
              lambda tt, x: tt.nn.functional.leaky_relu(x, 0.3)),
    "swish": (lambda x: oracle.swish_activation(x, 1.3),
              lambda y, g, x: oracle.swish_derivative(y, g, 1.3, x),
              lambda tt, x: x * tt.sigmoid(1.3 * x)),
    "line": (lambda x: oracle.line_activation(x, 2.5, -0.5),
             lambda y, g, x: oracle.line_activation(g, 2.5, 0.0),  # the book's derivative
             lambda tt, x: 2.5 * x - 0.5),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_and_derivative_match_autograd(torch, rng, name):
    act, deriv, ref = ACTIVATIONS[name]
    x, g = rng.standard_normal((6, 13)) * 3, rng.standard_normal((6, 13))
    y_ref, dx_ref = _vjp(torch, lambda xt: ref(torch, xt), x, g)
    y = act(x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(deriv(y, g, x), dx_ref, rtol=1e-11, atol=1e-14)


def test_softmax_and_derivative_match_torch(torch, rng):
    x, g = rng.standard_normal((5, 17)) * 4, rng.standard_normal((5, 17))
    y_ref, dx_ref = _vjp(torch, lambda xt: torch.softmax(xt, dim=-1), x, g)
    y = oracle.softmax_activation(x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(oracle.softmax_derivative(y, g), dx_ref, rtol=1e-11, atol=1e-15)


def test_mask_mult_matches_torch(torch, rng):
    x = rng.standard_normal(50)
    mask = (rng.uniform(size=50) > 0.3) / 0.7
    np.testing.assert_array_equal(oracle.mask_mult(x, mask),
                                  (torch.tensor(x) * torch.tensor(mask)).numpy())


# ------------------------------------------------------------------------------- dense
@pytest.mark.parametrize("batch", [None, 4])
def test_dense_layer_matches_autograd(torch, rng, batch):
    n, i = 6, 9
    W = rng.standard_normal((n, i + 1))
    x = rng.standard_normal(i if batch is None else (batch, i))
    g = rng.standard_normal(n if batch is None else (batch, n))
    Wt, xt = torch.tensor(W, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = torch.nn.functional.linear(xt, Wt[:, :i], Wt[:, i])
    y.backward(torch.tensor(g))   # g as the upstream gradient of y
    np.testing.assert_allclose(oracle.perceptron_feed_forward(x, W), y.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(oracle.calc_hidden_gradient(W, g), xt.grad.numpy(), rtol=1e-11, atol=1e-14)
    D0 = rng.standard_normal(W.shape)
    D = oracle.calc_delta_weights(x, D0.copy(), g)
    np.testing.assert_allclose(D, D0 + Wt.grad.numpy(), rtol=1e-11, atol=1e-14)


# ------------------------------------------------------------- finite differences (float64)
def _fd_vjp(f, x, g, h=1e-6):
    """g . d f(x)/dx by central differences, one input element at a time."""
    out = np.empty_like(x)
    for k in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[k] += h
        xm[k] -= h
        out[k] = ((f(xp) - f(xm)) * g).sum() / (2 * h)
    return out


@pytest.mark.parametrize("name", ["sigmoid", "swish", "tanh"])
def test_derivatives_match_finite_differences(rng, name):
    act, deriv, _ = ACTIVATIONS[name]
    x, g = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    np.testing.assert_allclose(deriv(act(x), g, x), _fd_vjp(act, x, g), rtol=1e-7, atol=1e-9)


def test_softmax_derivative_matches_finite_differences(rng):
    x, g = rng.standard_normal((2, 7)), rng.standard_normal((2, 7))
    got = oracle.softmax_derivative(oracle.softmax_activation(x), g)
    np.testing.assert_allclose(got, _fd_vjp(oracle.softmax_activation, x, g), rtol=1e-7, atol=1e-9)


def test_article_hidden_gradient_identity_is_the_backprop_of_the_next_layer(rng):
    # with activation "other" the article's hidden gradient is the plain product through W
    n, i = 5, 4
    W, g = rng.standard_normal((n, i + 1)), rng.standard_normal(n)
    f = lambda x: oracle.perceptron_feed_forward(x, W)  # noqa: E731
    x = rng.standard_normal(i)
    np.testing.assert_allclose(oracle.article_calc_hidden_gradient(W, g, x, 2),
                               _fd_vjp(f, x, g), rtol=1e-7)
