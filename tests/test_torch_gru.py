"""cugru.torch.GRU against torch.nn.GRU: outputs, h_n and every parameter's gradient, on the
CPU (float64, the numpy oracle) and on the GPU (cugru's kernels against cuDNN); the state
dict both ways, gradcheck, torch.compile, and the argument checks."""
import os
import subprocess
import sys

import numpy as np
import pytest

try:
    import torch
except ImportError:          # (CI installs the test extra, torch included)
    if os.environ.get("CI"):
        raise
    pytest.skip("torch is not installed (pip install torch==2.13.0)", allow_module_level=True)
rnn = torch.nn.utils.rnn

import cugru  # noqa: E402
from cugru import QuantSpec  # noqa: E402
from cugru.torch import GRU  # noqa: E402

#: (layers, bidirectional, batch_first, hx given, input kind)
CASES = [(L, bi, bf, hx, kind) for L in (1, 2, 3) for bi in (False, True)
         for bf, hx, kind in ((False, True, "padded"), (True, False, "padded"),
                              (False, False, "packed"), (True, True, "packed"))]


def _pair(L, bi, bf, dtype, device, I=5, H=7, **kw):
    ref = torch.nn.GRU(I, H, num_layers=L, bidirectional=bi, batch_first=bf, **kw).to(
        device=device, dtype=dtype)
    ours = GRU(I, H, num_layers=L, bidirectional=bi, batch_first=bf, device=device,
               dtype=dtype, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _inputs(L, bi, bf, hx, kind, dtype, device, T=6, B=4, I=5, H=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((B, T, I) if bf else (T, B, I), generator=g, dtype=dtype).to(device)
    h = torch.randn(L * (2 if bi else 1), B, H, generator=g, dtype=dtype).to(device) \
        if hx else None
    lengths = torch.tensor([3, T, 1, 4][:B]) if kind == "packed" else None
    return x, h, lengths


def _run(model, x, h, lengths, bf):
    """(output as a padded tensor, h_n, grads of x, h and every parameter) after a
    backward pass of fixed weights of the outputs."""
    x = x.detach().clone().requires_grad_()
    h = None if h is None else h.detach().clone().requires_grad_()
    model.zero_grad()
    inp = x if lengths is None else rnn.pack_padded_sequence(x, lengths, batch_first=bf,
                                                             enforce_sorted=False)
    out, hn = model(inp, h)
    if lengths is not None:
        assert isinstance(out, rnn.PackedSequence)
        packed_data = out.data
        out = rnn.pad_packed_sequence(out, batch_first=bf, total_length=x.shape[1 if bf else 0])[0]
    else:
        packed_data = None
    g = torch.Generator().manual_seed(1)
    wy = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)
    wh = torch.randn(hn.shape, generator=g, dtype=out.dtype).to(out.device)
    ((out * wy).sum() + (hn * wh).sum()).backward()
    grads = [x.grad] + ([h.grad] if h is not None else []) + [p.grad for p in model.parameters()]
    return out.detach(), hn.detach(), grads, packed_data


def _compare(a, b, tol):
    ya, ha, ga, pa = a
    yb, hb, gb, pb = b
    torch.testing.assert_close(ya, yb, rtol=0, atol=tol)
    torch.testing.assert_close(ha, hb, rtol=0, atol=tol)
    if pa is not None:
        torch.testing.assert_close(pa, pb.detach(), rtol=0, atol=tol)
    assert len(ga) == len(gb)
    for i, (u, v) in enumerate(zip(ga, gb)):
        scale = max(1.0, float(v.abs().max()))
        torch.testing.assert_close(u, v, rtol=0, atol=tol * scale, msg=f"gradient {i}")


@pytest.mark.parametrize("L,bi,bf,hx,kind", CASES)
def test_matches_nn_gru_on_the_cpu(L, bi, bf, hx, kind):
    ref, ours = _pair(L, bi, bf, torch.float64, "cpu")
    x, h, lengths = _inputs(L, bi, bf, hx, kind, torch.float64, "cpu")
    _compare(_run(ours, x, h, lengths, bf), _run(ref, x, h, lengths, bf), 1e-12)


def test_unbatched_input_and_no_bias_and_dropout_as_nn_gru():
    ref, ours = _pair(2, True, False, torch.float64, "cpu", bias=False)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randn(6, 5, dtype=torch.float64)
    h = torch.randn(4, 7, dtype=torch.float64)
    for a, b in zip(ours(x, h), ref(x, h)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # dropout between layers, in training mode only, with torch's generator
    ref, ours = _pair(3, False, False, torch.float64, "cpu", dropout=0.4)
    x = torch.randn(6, 4, 5, dtype=torch.float64)
    out = {}
    for mode in ("train", "eval"):
        getattr(ref, mode)()
        getattr(ours, mode)()
        torch.manual_seed(3)
        out[mode] = ours(x)[0]
        torch.manual_seed(3)
        torch.testing.assert_close(out[mode], ref(x)[0], rtol=0, atol=1e-12)
    assert not torch.equal(out["train"], out["eval"])      # (dropout ran in training only)
    ours.train()
    torch.manual_seed(4)
    assert not torch.equal(ours(x)[0], out["train"])       # (a new mask from a new seed)


def test_state_dict_round_trip_and_nn_gru_parameters():
    ref, ours = _pair(2, True, True, torch.float32, "cpu")
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and p1.shape == p2.shape and p1.dtype == p2.dtype
    back = torch.nn.GRU(5, 7, num_layers=2, bidirectional=True, batch_first=True)
    back.load_state_dict(ours.state_dict())
    fresh = GRU(5, 7, num_layers=2, bidirectional=True, batch_first=True)
    bound = 1 / np.sqrt(7)
    assert all(float(p.detach().abs().max()) <= bound for p in fresh.parameters())
    assert repr(fresh) == "GRU(5, 7, num_layers=2, batch_first=True, bidirectional=True)"


def test_gradcheck_in_float64_on_the_cpu():
    gru = GRU(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    h = torch.randn(4, 2, 4, dtype=torch.float64, requires_grad=True)
    params = list(gru.parameters())

    def f(x, h, *ps):
        with torch.nn.utils.stateless._reparametrize_module(
                gru, dict(zip([n for n, _ in gru.named_parameters()], ps))):
            y, hn = gru(x, h)
        return y, hn
    assert torch.autograd.gradcheck(f, (x, h, *[p.detach().requires_grad_() for p in params]))


def test_the_operator_is_registered_with_its_shapes_for_tracing():
    """torch.library's own check of the operator (schema, fake tensors, autograd)."""
    from cugru.torch import _spec_to_list
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    spec = _spec_to_list(QuantSpec(8, (1 / 64, 0, -128, 127), None, True))
    for bi in (False, True):
        ws = [torch.randn(s, dtype=torch.float64, requires_grad=True)
              for s in ((21, 5), (21, 7), (21,), (21,)) * (2 if bi else 1)]
        h = h0 if bi else h0[:1]
        for quant in (None, spec):
            for lengths in (None, torch.tensor([4, 2, 3])):
                torch.library.opcheck(torch.ops.cugru.gru_layer.default,
                                      (x, h, ws, lengths, bi, True, quant, "auto"))


def test_torch_compile_traces_it_without_a_graph_break():
    gru = GRU(5, 7, num_layers=2, bidirectional=True, dtype=torch.float64)
    head = torch.nn.Linear(14, 3, dtype=torch.float64)

    def f(x):
        y, _ = gru(x)
        return head(y).sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 4, 5, dtype=torch.float64)
    loss = compiled(x)
    loss.backward()
    got = [p.grad.clone() for p in gru.parameters()]
    gru.zero_grad()
    head.zero_grad()
    f(x).backward()
    for a, b in zip(got, gru.parameters()):
        torch.testing.assert_close(a, b.grad, rtol=0, atol=1e-12)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _functional(device):
    """(array module, to array, to numpy) for cugru's functional calls on `device`."""
    if device == "cpu":
        return np, lambda t: t.detach().numpy(), lambda a: a
    import cupy
    return cupy, lambda t: cupy.asarray(t.detach()), cupy.asnumpy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_quantization_aware_layers_are_the_functional_calls(device, bidirectional):
    """The module with quant= is cugru's functional calls with that spec, bit for bit
    (forward, and the gradients of x and of every parameter)."""
    xp, arr, host = _functional(device)
    spec = QuantSpec(8, (1 / 32, 0, -128, 127), (1 / 64, 0, -128, 127), True)
    gru = GRU(5, 7, bidirectional=bidirectional, dtype=torch.float64, quant=spec,
              device=device)
    x = torch.randn(6, 4, 5, dtype=torch.float64, requires_grad=True, device=device)
    y, hn = gru(x)
    y.sum().backward()
    sfx = ("", "_reverse") if bidirectional else ("",)
    w = [xp.stack([arr(getattr(gru, f"{k}_l0{s}")) for s in sfx])
         for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    ey, ehn, saved = cugru.gru_forward(arr(x), None, *w, bidirectional=bidirectional,
                                       quant=spec)
    assert np.array_equal(y.detach().cpu().numpy(), host(ey))
    assert np.array_equal(hn.detach().cpu().numpy(), host(ehn))
    grads = cugru.gru_backward(xp.ones_like(ey), None, saved)
    assert np.array_equal(x.grad.cpu().numpy(), host(grads[0]))
    for k, name in enumerate(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
        for d, s in enumerate(sfx):
            assert np.array_equal(getattr(gru, f"{name}_l0{s}").grad.cpu().numpy(),
                                  host(grads[2 + k][d])), f"{name}_l0{s}"


def _train_step(gru, x, h=None):
    """(y, and the gradients of x, h (when given) and every parameter) after a backward
    pass of y.square().sum()."""
    x = x.detach().clone().requires_grad_()
    h = None if h is None else h.detach().clone().requires_grad_()
    gru.zero_grad()
    y, _ = gru(x, h)
    y.square().sum().backward()
    return y.detach(), [x.grad] + ([] if h is None else [h.grad]) + \
        [p.grad.clone() for p in gru.parameters()]


@pytest.mark.parametrize("device", DEVICES)
def test_a_change_in_place_before_backward_is_torch_s_error(device):
    """x and the parameters go through save_for_backward: changed in place between the
    passes, backward raises torch's error instead of computing with the new values."""
    f64 = dict(dtype=torch.float64, device=device)
    gru = GRU(5, 7, num_layers=2, bidirectional=True, **f64)
    x = torch.randn(6, 4, 5, **f64, requires_grad=True)
    y, _ = gru(x)
    with torch.no_grad():
        gru.weight_hh_l1_reverse.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    layer_in = torch.randn(6, 4, 5, **f64)
    y, _ = gru(layer_in.requires_grad_())
    with torch.no_grad():
        layer_in.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional,quant,hx", [(True, False, False), (False, False, True),
                                                     (True, True, True), (False, True, False)])
def test_saved_tensor_hooks_and_retain_graph_give_the_same_gradients(device, bidirectional,
                                                                     quant, hx):
    """Saved-tensor hooks that hand back other tensors (copies at other addresses, or the
    history moved to the CPU and back) give the same bits as none: on the GPU the backward
    pass then makes its arrays on what comes back (x, the parameters or their stacked
    copies, the history, the quantized operands, x and h0 as given); backward twice with
    retain_graph gives the gradients twice."""
    f32 = dict(dtype=torch.float32, device=device)
    spec = QuantSpec(8, (1 / 32, 0, -128, 127), (1 / 64, 0, -128, 127), True) if quant \
        else None
    gru = GRU(5, 16, num_layers=2, bidirectional=bidirectional, quant=spec, **f32)
    x = torch.randn(7, 3, 5, **f32)
    h = torch.randn(2 * (2 if bidirectional else 1), 3, 16, **f32) if hx else None
    plain = _train_step(gru, x, h)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        copied = _train_step(gru, x, h)
    hooks = [torch.autograd.graph.save_on_cpu()] if device == "cuda" else []
    for hook in hooks:
        with hook:
            moved = _train_step(gru, x, h)
        assert all(torch.equal(a, b) for a, b in zip(moved[1], plain[1]))
    assert torch.equal(copied[0], plain[0])
    assert all(torch.equal(a, b) for a, b in zip(copied[1], plain[1]))
    gru.zero_grad()
    y, _ = gru(x, h)
    y.square().sum().backward(retain_graph=True)
    y.square().sum().backward()
    for p, g in zip(gru.parameters(), plain[1][2 if hx else 1:]):
        assert torch.equal(p.grad, 2 * g)


def test_bad_arguments_name_them():
    with pytest.raises(ValueError, match="hidden_size must be an integer >= 1"):
        GRU(3, 0)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        GRU(3, 4, dropout=1.5)
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        GRU(3, 4, dtype=torch.float16)
    with pytest.raises(TypeError, match="quant must be a cugru.QuantSpec"):
        GRU(3, 4, quant=8)
    with pytest.raises(ValueError, match="path must be one of"):
        GRU(3, 4, path="fastest")
    gru = GRU(3, 4)
    with pytest.raises(ValueError, match="input has 5 features, expected input_size = 3"):
        gru(torch.randn(2, 2, 5))
    with pytest.raises(ValueError, match=r"hx has shape \(2, 2, 4\), expected \(1, 2, 4\)"):
        gru(torch.randn(2, 2, 3), torch.randn(2, 2, 4))
    with pytest.raises(ValueError, match="2 \\(unbatched\\) or 3 dimensions"):
        gru(torch.randn(3))
    with pytest.raises(TypeError, match="input has dtype torch.int64"):
        gru(torch.ones(2, 2, 3, dtype=torch.int64))


def test_import_cugru_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, cugru, cukernels; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("L,bi,bf,hx,kind", CASES)
def test_matches_cudnn_on_the_gpu(L, bi, bf, hx, kind):
    """float64 on the GPU against cuDNN in float64, and float32 against cuDNN in float32
    (strict), both within the float32 tolerance of test_gru_gpu.py's shapes."""
    for dtype, tol in ((torch.float64, 1e-11), (torch.float32, 2e-5)):
        torch.backends.cudnn.allow_tf32 = False
        ref, ours = _pair(L, bi, bf, dtype, "cuda", I=16, H=32)
        x, h, lengths = _inputs(L, bi, bf, hx, kind, dtype, "cuda", T=9, B=4, I=16, H=32)
        _compare(_run(ours, x, h, lengths, bf), _run(ref, x, h, lengths, bf), tol)


@pytest.mark.gpu
def test_runs_on_torch_s_current_stream_and_repeats_its_bits():
    gru = GRU(16, 32, num_layers=2, bidirectional=True, device="cuda")
    x = torch.randn(9, 4, 16, device="cuda")
    s = torch.cuda.Stream()
    outs = []
    # (the parameters' gradient accumulators stay on the stream of their first use)
    torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)
    for stream in (torch.cuda.current_stream(), s, s):
        with torch.cuda.stream(stream):
            y, hn = gru(x)
            y.sum().backward()
            outs.append((y.detach().clone(), [p.grad.clone() for p in gru.parameters()]))
            gru.zero_grad()
    torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(True)
    torch.cuda.synchronize()
    for y, g in outs[1:]:
        assert torch.equal(y, outs[0][0]) and all(torch.equal(a, b) for a, b in zip(g, outs[0][1]))


@pytest.mark.gpu
def test_outputs_change_in_place_as_nn_gru_s_do():
    """y += 1, relu_ and h_n.detach_() work on the GPU results as on nn.GRU's (they are
    tensors on torch's memory, not views that autograd forbids changing); and since ours
    keeps no output for its backward pass, the gradient then flows through them too
    (nn.GRU's cuDNN backward reads y, so it refuses that)."""
    ref, ours = _pair(1, False, False, torch.float32, "cuda", I=16, H=32)
    x = torch.randn(9, 4, 16, device="cuda", dtype=torch.float32, requires_grad=True)
    for model in (ref, ours):
        y, hn = model(x)
        y.add_(1)
        torch.relu_(y)
        hn.detach_()
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.gpu
def test_the_history_is_freed_by_backward_and_nothing_waits_for_the_collector():
    """The history (hs, gates: (5T + 1)·B·H elements here) lives from the forward pass to
    the end of the backward pass, not as long as y: after backward, with y still held,
    torch's allocator holds less than half of it beyond what it held before; with y gone,
    next to nothing. With Python's garbage collector off: no reference cycle may keep a
    call's memory."""
    import gc
    f32 = dict(dtype=torch.float32, device="cuda")
    T, B, I, H = 400, 8, 4, 64
    gru = GRU(I, H, **f32)
    x = torch.randn(T, B, I, **f32, requires_grad=True)
    history = (5 * T + 1) * B * H * 4
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):      # (cugru's kept temporaries exist from the first on)
            gru(x)[0].sum().backward()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y, _ = gru(x)
        assert torch.cuda.memory_allocated() - before > history
        y.sum().backward()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() - before < history / 2
        del y
        assert torch.cuda.memory_allocated() - before < history / 16
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["small", "steps", "fast"])
def test_a_train_step_captured_in_a_cuda_graph_replays_the_eager_bits(path):
    """torch.cuda.graph captures a train step (forward and backward, cuBLAS products
    included on the paths that have them); each replay gives the gradients an eager step
    gives, bit for bit, and new inputs copied into the captured ones give theirs."""
    f32 = dict(dtype=torch.float32, device="cuda")
    gru = GRU(16, 32, num_layers=2, bidirectional=True, path=path, **f32)
    x = torch.randn(9, 4, 16, **f32, requires_grad=True)
    dy = torch.randn(9, 4, 64, **f32)

    from bench.torch_gru import captured_step

    def eager_grads(x_value):
        x2 = x_value.detach().clone().requires_grad_()
        gru.zero_grad()
        y, _ = gru(x2)
        torch.autograd.backward(y, dy)
        return [x2.grad.clone()] + [p.grad.clone() for p in gru.parameters()]
    graph = captured_step(torch, gru, x, dy)
    grads = [x.grad] + [p.grad for p in gru.parameters()]     # (the graph's memory)
    for value in (x.detach().clone(), torch.randn(9, 4, 16, **f32)):
        with torch.no_grad():
            x.copy_(value)
            for g in grads:
                g.zero_()
        graph.replay()
        torch.cuda.synchronize()
        got = [g.clone() for g in grads]
        want = eager_grads(value)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
def test_variable_lengths_under_capture_are_a_clear_error():
    f32 = dict(dtype=torch.float32, device="cuda")
    gru = GRU(16, 32, **f32)
    # (sorted lengths: unsorted ones make torch's own pad_packed_sequence read its
    # indices back to the host, which a capture refuses before cugru sees the lengths)
    packed = rnn.pack_padded_sequence(torch.randn(9, 4, 16, **f32), torch.tensor([9, 7, 5, 3]))
    gru(packed)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="lengths cannot be taken while the stream is "
                                         "captured"):
        with torch.cuda.graph(graph):
            gru(packed)
    y, _ = gru(packed)              # (the stream and the module are sound after it)
    assert torch.isfinite(y.data).all()


@pytest.mark.gpu
def test_path_and_devices_reach_cugru_as_given():
    """path= is cugru's plan (the small path refuses a shape beyond it); a hidden state or a
    module on another device than the input is an error naming it, not a bad address."""
    f32 = dict(dtype=torch.float32)     # (other tests set torch's default dtype to float64)
    big = GRU(16, 64, device="cuda", path="small", **f32)
    with pytest.raises(ValueError, match="path='small': D\\*B\\*H = "):
        big(torch.randn(9, 32, 16, device="cuda", **f32))
    gru = GRU(16, 32, device="cuda", **f32)
    with pytest.raises(ValueError, match="hx is a torch.float32 tensor on cpu"):
        gru(torch.randn(9, 4, 16, device="cuda", **f32), torch.randn(1, 4, 32, **f32))
    with pytest.raises(ValueError, match="weight_ih_l0 is a torch.float32 tensor on cpu"):
        GRU(16, 32, **f32)(torch.randn(9, 4, 16, device="cuda", **f32))
    y, _ = gru(torch.randn(9, 4, 16, device="cuda", **f32))   # (the context is still sound)
    assert torch.isfinite(y).all()


@pytest.mark.gpu
def test_torch_compile_on_the_gpu():
    gru = GRU(16, 32, num_layers=2, bidirectional=True, device="cuda")

    def f(x):
        return gru(x)[0].square().mean()
    x = torch.randn(9, 4, 16, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    loss = compiled(x)
    loss.backward()
    got = [p.grad.clone() for p in gru.parameters()]
    gru.zero_grad()
    f(x).backward()
    for a, b in zip(got, gru.parameters()):
        torch.testing.assert_close(a, b.grad, rtol=1e-5, atol=1e-6)


#: the DistributedDataParallel check, run in a process of its own: with gloo in the test
#: runner's process, one CI run hung in this test; a process that hangs is killed at the
#: timeout and the test fails saying so, and the process leaves through os._exit once its
#: result is printed (as cugru.ddp does)
_DDP_SCRIPT = """
import os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from cugru.torch import GRU
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
gru = GRU(5, 7, num_layers=2, bidirectional=True, dtype=torch.float64)
alone = GRU(5, 7, num_layers=2, bidirectional=True, dtype=torch.float64)
alone.load_state_dict(gru.state_dict())
ddp = DistributedDataParallel(gru)
x = torch.randn(6, 4, 5, dtype=torch.float64)
ddp(x)[0].square().sum().backward()
alone(x)[0].square().sum().backward()
worst = max(float((a.grad - b.grad).abs().max())
            for a, b in zip(gru.parameters(), alone.parameters()))
n = sum(1 for a in gru.parameters() if a.grad is not None)
dist.destroy_process_group()
print(f"grads {n} worst {worst!r}", flush=True)
os._exit(0)
"""


def test_under_distributed_data_parallel(tmp_path):
    """DistributedDataParallel (one process, gloo) wraps it and reduces its gradients: the
    same gradients as the module alone."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, GLOO_SOCKET_IFNAME="lo")
    try:
        p = subprocess.run([sys.executable, "-c", _DDP_SCRIPT, str(tmp_path / "store")],
                           env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the DistributedDataParallel process did not end within 180 s: {e.stderr}")
    assert p.returncode == 0, p.stderr
    _, n, _, worst = p.stdout.split()
    assert int(n) == len(list(GRU(5, 7, num_layers=2, bidirectional=True).parameters())) == 16
    assert float(worst) <= 1e-12
