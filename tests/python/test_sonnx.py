"""ONNX graphs on tandem (sonnx): the outputs of graphs built with onnx.helper against onnx's own
reference evaluator (a NumPy implementation of the operator specifications), the gradients of a
SONNXModel's parameters against finite differences of that evaluator, and training."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tandem  # noqa: E402
from tandem import autograd, layer, opt, sonnx, tensor  # noqa: E402

N = h.make_node


def model(nodes, inputs, outputs, inits, opset, dtype=TP.FLOAT):
    """inputs: (name, shape[, elem type]); outputs: names; inits: name -> array."""
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(i[0], i[2] if len(i) > 2 else dtype, i[1]) for i in inputs],
                     [h.make_tensor_value_info(o, dtype, None) for o in outputs],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def reference(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


def cnn(dtype=np.float32, opset=14):
    """Convolutions with asymmetric pads, strides and groups, batch norm, pools (ceil mode, pads not
    counted), a residual, a global pool, a reshape and a Gemm."""
    rng = np.random.default_rng(0)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(dtype)  # noqa: E731
    inits = {"w1": f(8, 3, 3, 3), "b1": f(8), "g": np.abs(f(8)) + 0.5, "be": f(8), "mu": f(8),
             "var": np.abs(f(8)) + 0.5, "w2": f(8, 4, 3, 3), "fc": f(5, 8), "fcb": f(5),
             "shape": np.array([0, -1], np.int64)}
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 0, 2, 1], strides=[2, 1]),
             N("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["bn"], epsilon=1e-3),
             N("Relu", ["bn"], ["r"]),
             N("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
             N("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             N("Add", ["c2", "p"], ["s"]),
             N("AveragePool", ["s"], ["ap"], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 0, 0]),
             N("GlobalAveragePool", ["ap"], ["gp"]),
             N("Reshape", ["gp", "shape"], ["fl"]),
             N("Gemm", ["fl", "fc", "fcb"], ["y"], transB=1, alpha=0.5),
             N("Softmax", ["y"], ["prob"], axis=1)]
    elem = TP.DOUBLE if dtype == np.float64 else TP.FLOAT
    x = rng.standard_normal((2, 3, 11, 9)).astype(dtype)
    return model(nodes, [("x", [2, 3, 11, 9])], ["prob"], inits, opset, elem), {"x": x}


def attention():
    """Token and position embeddings, layer norm, attention with heads and a padding mask, GELU by erf,
    an RMS normalisation, slicing and padding: shapes computed in the graph from its input (Shape,
    Gather, Range, Unsqueeze, Concat, ConstantOfShape, Expand)."""
    rng = np.random.default_rng(1)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    V, C, H, T, B = 11, 8, 2, 5, 2
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    s64 = lambda v: np.array(v, np.int64)  # noqa: E731
    inits = {"emb": f(V, C), "pos": f(T, C), "lnw": f(C) + 1, "lnb": f(C), "wqkv": f(C, 3 * C), "bqkv": f(3 * C),
             "wo": f(C, C), "ax0": i64(0), "ax1": i64(1), "m1": i64(-1), "s0": s64(0), "s1": s64(1),
             "heads": s64(H), "hd": s64(C // H), "split": i64(C, C, C), "scale": np.array(np.sqrt(C // H), np.float32),
             "two": np.array(2.0, np.float32), "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
             "rs2": np.array(1 / np.sqrt(2), np.float32), "neg": np.array(-1e4, np.float32), "sl_s": i64(1),
             "sl_e": i64(2 ** 62), "sl_a": i64(1), "pads": i64(0, 1, 0, 0, 0, 0), "eshape": i64(B, T, 2)}
    nodes = [
        N("Shape", ["ids"], ["ids_shape"]), N("Gather", ["ids_shape", "s1"], ["t_len"]),
        N("Unsqueeze", ["t_len", "ax0"], ["t1"]), N("Concat", ["t1", "t1"], ["tt"], axis=0),
        N("Constant", [], ["zero_f"], value_float=0.0),
        N("Gather", ["emb", "ids"], ["e"]), N("Range", ["s0", "t_len", "s1"], ["positions"]),
        N("Gather", ["pos", "positions"], ["p"]), N("Add", ["e", "p"], ["x0"]),
        N("LayerNormalization", ["x0", "lnw", "lnb"], ["x1"], axis=-1, epsilon=1e-5),
        N("MatMul", ["x1", "wqkv"], ["qkv0"]), N("Add", ["qkv0", "bqkv"], ["qkv"]),
        N("Split", ["qkv", "split"], ["q", "k", "v"], axis=2),
        N("Shape", ["q"], ["qs"]), N("Gather", ["qs", "s0"], ["bsz"]), N("Unsqueeze", ["bsz", "ax0"], ["bsz1"]),
        N("Unsqueeze", ["heads", "ax0"], ["h1"]), N("Unsqueeze", ["hd", "ax0"], ["d1"]),
        N("Concat", ["bsz1", "t1", "h1", "d1"], ["hshape"], axis=0),
        N("Reshape", ["q", "hshape"], ["q4"]), N("Reshape", ["k", "hshape"], ["k4"]),
        N("Reshape", ["v", "hshape"], ["v4"]),
        N("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]), N("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        N("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        N("MatMul", ["qt", "kt"], ["att0"]), N("Div", ["att0", "scale"], ["att1"]),
        N("ConstantOfShape", ["tt"], ["ones"], value=nh.from_array(np.array([1.0], np.float32))),
        N("Equal", ["mask_in", "zero_f"], ["pad"]),
        N("Unsqueeze", ["pad", "ax1"], ["pad1"]), N("Unsqueeze", ["pad1", "ax1"], ["pad2"]),
        N("Where", ["pad2", "neg", "att1"], ["att2"]), N("Mul", ["att2", "ones"], ["att3"]),
        N("Softmax", ["att3"], ["prob"], axis=-1), N("MatMul", ["prob", "vt"], ["o4"]),
        N("Transpose", ["o4"], ["o3"], perm=[0, 2, 1, 3]),
        N("Concat", ["bsz1", "t1", "m1"], ["oshape"], axis=0), N("Reshape", ["o3", "oshape"], ["o"]),
        N("MatMul", ["o", "wo"], ["proj"]),
        N("Mul", ["proj", "rs2"], ["g0"]), N("Erf", ["g0"], ["g1"]), N("Add", ["g1", "one"], ["g2"]),
        N("Mul", ["proj", "g2"], ["g3"]), N("Mul", ["g3", "half"], ["gelu"]),
        N("Pow", ["gelu", "two"], ["sq"]), N("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        N("Sqrt", ["ms"], ["rms"]), N("Div", ["gelu", "rms"], ["normed"]),
        N("Slice", ["normed", "sl_s", "sl_e", "sl_a"], ["tail"]),
        N("Pad", ["tail", "pads"], ["padded"], mode="constant"),
        N("Cast", ["ids"], ["idsf"], to=TP.FLOAT), N("Unsqueeze", ["idsf", "m1"], ["idsf1"]),
        N("Expand", ["idsf1", "eshape"], ["idse"]), N("Concat", ["padded", "idse"], ["y"], axis=2)]
    m = model(nodes, [("ids", [B, T], TP.INT64), ("mask_in", [B, T])], ["y"], inits, 17)
    mask = np.ones((B, T), np.float32)
    mask[1, 3:] = 0
    return m, {"ids": rng.integers(0, V, (B, T)).astype(np.int64), "mask_in": mask}


def older_opsets():
    """Opset 9's forms: attributes where later sets take inputs (Slice, Unsqueeze, Split, Clip, Pad),
    Upsample, Dropout, and PRelu, LeakyRelu, Sum, Max, Flatten, DepthToSpace."""
    rng = np.random.default_rng(2)
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    inits = {"slope": np.abs(f(4, 1, 1)) * 0.2, "scales": np.array([1, 1, 2, 2], np.float32), "w": f(4, 4, 1, 1)}
    nodes = [N("PRelu", ["x", "slope"], ["pr"]), N("LeakyRelu", ["pr"], ["lr"], alpha=0.2),
             N("Clip", ["lr"], ["cl"], min=-0.5, max=0.6),
             N("Split", ["cl"], ["a", "b"], axis=1, split=[1, 3]),
             N("Slice", ["b"], ["bs"], starts=[1, 0], ends=[3, 100], axes=[1, 3]),
             N("Sum", ["a", "bs", "a"], ["sm"]), N("Max", ["sm", "a"], ["mx"]),
             N("Pad", ["mx"], ["pd"], pads=[0, 0, 1, 0, 0, 0, 0, 1], mode="edge"),
             N("Upsample", ["pd", "scales"], ["up"], mode="nearest"),
             N("Conv", ["x", "w"], ["cv"]), N("DepthToSpace", ["cv"], ["d2s"], blocksize=2),
             N("Dropout", ["d2s"], ["dr"], ratio=0.3),
             N("Flatten", ["up"], ["up2"], axis=1), N("Softmax", ["up2"], ["soft"], axis=1),
             N("Flatten", ["dr"], ["fl"], axis=2),
             N("Unsqueeze", ["fl"], ["un"], axes=[0])]
    m = model(nodes, [("x", [2, 4, 3, 5])], ["soft", "un"], inits, 9)
    return m, {"x": rng.standard_normal((2, 4, 3, 5)).astype(np.float32)}


def misc():
    """The remaining operators, opset 17: InstanceNormalization, Resize by scales, GlobalMaxPool, the other
    reductions and activations, Tile, Mean/Min, ArgMax, Size, Sign, Xor, a 1-d Conv and a MaxPool with
    automatic padding."""
    rng = np.random.default_rng(7)
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    inits = {"sc": f(3) + 1, "bi": f(3), "roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 3], np.float32),
             "rep": np.array([1, 2, 1, 1], np.int64), "ax": np.array([2, 3], np.int64), "w1d": f(4, 3, 3),
             "half": np.array([0.5], np.float32)}
    nodes = [N("InstanceNormalization", ["x", "sc", "bi"], ["inorm"], epsilon=1e-4),
             N("Resize", ["inorm", "roi", "scales"], ["rs"], mode="nearest"),
             N("GlobalMaxPool", ["rs"], ["gmp"]), N("ReduceMax", ["rs"], ["rmax"], axes=[1], keepdims=0),
             N("ReduceMin", ["rs"], ["rmin"], axes=[2, 3], keepdims=1), N("ReduceSum", ["rs", "ax"], ["rsum"]),
             N("HardSigmoid", ["rs"], ["hs"], alpha=0.3, beta=0.4), N("Selu", ["hs"], ["se"]),
             N("Elu", ["x"], ["el"], alpha=0.7), N("Softplus", ["el"], ["sp"]), N("Softsign", ["sp"], ["ss"]),
             N("Tile", ["ss", "rep"], ["ti"]), N("LogSoftmax", ["ti"], ["ls"], axis=1),
             N("Mean", ["x", "el", "ss"], ["mean"]), N("Min", ["mean", "x"], ["mn"]), N("Sign", ["mn"], ["sg"]),
             N("ArgMax", ["x"], ["am"], axis=1, keepdims=1), N("Cast", ["am"], ["amf"], to=TP.FLOAT),
             N("Size", ["x"], ["sz"]), N("Cast", ["sz"], ["szf"], to=TP.FLOAT), N("Mul", ["sg", "szf"], ["sgs"]),
             N("Greater", ["x", "half"], ["g1"]), N("Less", ["x", "half"], ["l1"]), N("Xor", ["g1", "l1"], ["xo"]),
             N("Cast", ["xo"], ["xof"], to=TP.FLOAT),
             N("Reshape", ["x", "shape3"], ["x3"]), N("Conv", ["x3", "w1d"], ["c1d"], pads=[2, 0]),
             N("MaxPool", ["x"], ["mp"], kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
             N("Add", ["mp", "half"], ["mph"])]
    inits["shape3"] = np.array([2, 3, 20], np.int64)
    m = model(nodes, [("x", [2, 3, 4, 5])], ["gmp", "rmax", "rmin", "rsum", "se", "ls", "sgs", "amf", "xof", "c1d",
                                            "mph"], inits, 17)
    return m, {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}


@pytest.mark.parametrize("make", [cnn, attention, older_opsets, misc], ids=["cnn", "attention", "opset9", "misc"])
def test_prepare_runs_graphs_as_the_reference_does(make):
    m, feeds = make()
    want = reference(m, feeds)
    rep = sonnx.prepare(m)
    got = rep.run(list(feeds.values()))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray) and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def pool_oracle(x, op, kernel, strides, pads, ceil, count_pad):
    """ONNX's MaxPool / AveragePool written out from their definition (as PyTorch and onnxruntime compute them):
    output extent floor or ceil((in + pads - k) / s) + 1, less a ceil-mode window that would start past the
    input and its leading padding; window i covers [i s - pad_begin, i s - pad_begin + k) clipped to the input;
    the average divides by the window's positions inside the padded input (count_include_pad) or the input."""
    size, begin, end = x.shape[2:], pads[:2], pads[2:]

    def extent(d):
        e = size[d] + begin[d] + end[d] - kernel[d]
        o = (-(-e // strides[d]) if ceil else e // strides[d]) + 1
        return o - 1 if ceil and (o - 1) * strides[d] >= size[d] + begin[d] else o

    y = np.zeros(x.shape[:2] + (extent(0), extent(1)), x.dtype)
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            lo = [i * strides[0] - begin[0], j * strides[1] - begin[1]]
            hi = [lo[d] + kernel[d] for d in range(2)]
            win = x[:, :, max(lo[0], 0):min(hi[0], size[0]), max(lo[1], 0):min(hi[1], size[1])]
            if op == "MaxPool":
                y[:, :, i, j] = win.max(axis=(2, 3))
                continue
            first = [-begin[d] if count_pad else 0 for d in range(2)]
            last = [size[d] + end[d] if count_pad else size[d] for d in range(2)]
            count = np.prod([min(hi[d], last[d]) - max(lo[d], first[d]) for d in range(2)])
            y[:, :, i, j] = win.sum(axis=(2, 3)) / count
    return y


def reference_pools_agree(op, shape, kernel, strides, pads, ceil):
    """Whether onnx's reference evaluator (1.16 to 1.23 at least) computes this pooling as its definition says.
    It does not for a MaxPool whose strides are all 1 (an older implementation, which reads asymmetric pads in
    another order and grows the output in ceil mode), nor in ceil mode where the windows reach two or more
    positions past the padded input (it pads half of that before the input, which shifts every window)."""
    if op == "MaxPool" and all(s == 1 for s in strides) and (ceil or pads[:2] != pads[2:]):
        return False
    for d in range(2):
        e = shape[d] + pads[d] + pads[d + 2] - kernel[d]
        o = (-(-e // strides[d]) if ceil else e // strides[d]) + 1
        if ceil and (o - 1) * strides[d] >= shape[d] + pads[d]:
            o -= 1
        if (o - 1) * strides[d] + kernel[d] - shape[d] - pads[d] - pads[d + 2] >= 2:
            return False
    return True


POOL_GRID = [(shape, kernel, strides, pads)
             for shape in [(5, 5), (6, 7), (7, 4)]
             for kernel in [(2, 2), (3, 3), (3, 2)]
             for strides in [(1, 1), (2, 2), (3, 2)]
             for pads in [(0, 0, 0, 0), (1, 1, 1, 1), (1, 0, 0, 1), (0, 1, 1, 0), (1, 1, 0, 0)]]


@pytest.mark.parametrize("shape,kernel,strides,pads", POOL_GRID,
                         ids=["{}x{}-k{}x{}-s{}x{}-p{}{}{}{}".format(*g[0], *g[1], *g[2], *g[3]) for g in POOL_GRID])
def test_pools_match_the_reference_in_every_geometry(shape, kernel, strides, pads):
    """MaxPool and AveragePool (count_include_pad 0 and 1), floor and ceil mode, symmetric and asymmetric pads,
    against onnx's reference evaluator; where that evaluator departs from the operators' definition (see
    reference_pools_agree) against the definition written out, which the reference checks everywhere else."""
    x = np.random.default_rng(sum(shape) * 7 + sum(pads)).standard_normal((2, 3) + shape).astype(np.float32)
    for ceil in (0, 1):
        for op, count_pad in (("MaxPool", 0), ("AveragePool", 0), ("AveragePool", 1)):
            attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=list(pads), ceil_mode=ceil)
            if op == "AveragePool":
                attrs["count_include_pad"] = count_pad
            m = model([N(op, ["x"], ["y"], **attrs)], [("x", [2, 3, *shape])], ["y"], {}, 17)
            what = f"{op} ceil_mode={ceil} count_include_pad={count_pad}"
            want = pool_oracle(x, op, kernel, strides, pads, ceil, count_pad)
            if reference_pools_agree(op, shape, kernel, strides, pads, ceil):
                np.testing.assert_allclose(reference(m, {"x": x})[0], want, rtol=1e-6, atol=1e-6, err_msg=what)
            got = sonnx.prepare(m).run([x])[0]
            assert got.shape == want.shape, what
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


def test_a_ceil_mode_window_never_starts_in_the_padding():
    """A 5x5 input, kernel 2, stride 2, pads 1, ceil mode: 3x3 (a 4th window would start in the trailing
    padding and hold no input element: once an extra row of -3e38 or NaN), and count_include_pad divides by
    the padded positions, never by ceil mode's overhang."""
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    for op, extra in (("MaxPool", {}), ("AveragePool", {"count_include_pad": 1}), ("AveragePool", {})):
        m = model([N(op, ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, **extra)],
                  [("x", [1, 1, 5, 5])], ["y"], {}, 17)
        got = sonnx.prepare(m).run([x])[0]
        assert got.shape == (1, 1, 3, 3) and np.isfinite(got).all(), (op, extra, got)
        np.testing.assert_allclose(got, reference(m, {"x": x})[0], rtol=1e-6, err_msg=f"{op} {extra}")
    # The overhang: no padding, kernel 3, stride 2 on 6 positions: windows at 0, 2 and 4, the last covering
    # two positions; count_include_pad has no padding to count, so both averages divide by 2 there.
    x = np.ones((1, 1, 6, 6), np.float32)
    for count_pad in (0, 1):
        m = model([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
                     count_include_pad=count_pad)], [("x", [1, 1, 6, 6])], ["y"], {}, 17)
        np.testing.assert_allclose(sonnx.prepare(m).run([x])[0], np.ones((1, 1, 3, 3)), rtol=1e-6)


def test_bools_made_by_casts_take_the_logical_operators():
    """Cast to BOOL gives tandem a uint8 tensor, which And, Or, Xor and Not take (as 1/0 masks)."""
    nodes = [N("Cast", ["x"], ["b"], to=TP.BOOL), N("Less", ["x", "half"], ["l"]), N("And", ["b", "l"], ["a"]),
             N("Or", ["b", "l"], ["o"]), N("Xor", ["a", "o"], ["xo"]), N("Not", ["b"], ["n"]),
             N("Where", ["xo", "x", "half"], ["w"]), N("Cast", ["n"], ["nf"], to=TP.FLOAT),
             N("Add", ["w", "nf"], ["y"])]
    m = model(nodes, [("x", [2, 3])], ["y"], {"half": np.array(0.5, np.float32)}, 17)
    x = np.array([[0, 0.25, 1], [-2, 0, 0.75]], np.float32)
    np.testing.assert_allclose(sonnx.prepare(m).run([x])[0], reference(m, {"x": x})[0])


def test_softmax_before_opset_13_flattens_from_its_axis():
    """Softmax-1/11 coerce the input to 2-d at the axis (onnx's reference evaluator takes the axis alone)."""
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    for opset, want in ((11, np.exp(x) / np.exp(x).sum((1, 2), keepdims=True)),
                        (13, np.exp(x) / np.exp(x).sum(1, keepdims=True))):
        m = model([N("Softmax", ["x"], ["y"], axis=1)], [("x", [2, 3, 4])], ["y"], {}, opset)
        np.testing.assert_allclose(sonnx.prepare(m).run([x])[0], want, rtol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_of_opset_20_with_a_warning_about_the_set(approximate):
    x = np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)
    m = model([N("Gelu", ["x"], ["y"], approximate=approximate)], [("x", [3, 4])], ["y"], {}, 20)
    with pytest.warns(UserWarning, match="operator set 20 is newer"):
        rep = sonnx.prepare(m)
    np.testing.assert_allclose(rep.run([x])[0], reference(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_lrn_follows_the_specification():
    """LRN by the specification's formula in NumPy (onnx's reference evaluator loops over the batch where the
    specification sums over channels)."""
    x = np.random.default_rng(6).standard_normal((2, 6, 3, 4)).astype(np.float32)
    size, alpha, beta, bias = 4, 0.3, 0.75, 2.0
    sq = np.zeros_like(x)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + -(-(size - 1) // 2))
        sq[:, c] = (x[:, lo:hi + 1] ** 2).sum(1)
    m = model([N("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)], [("x", [2, 6, 3, 4])], ["y"],
              {}, 13)
    np.testing.assert_allclose(sonnx.prepare(m).run([x])[0], x / (bias + alpha / size * sq) ** beta, rtol=1e-5)


def test_double_precision_and_tensors_in():
    m, feeds = cnn(np.float64)
    want = reference(m, feeds)[0]
    got = sonnx.prepare(m).run([tensor.from_numpy(feeds["x"], dtype=tensor.float64)])[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_last_layers_and_aux_output_as_singa():
    m, feeds = cnn()
    rep = sonnx.prepare(m)
    x = feeds["x"]
    n = len(m.graph.node)
    gp = reference(_with_outputs(m, ["gp"]), feeds)[0]
    fl = reference(_with_outputs(m, ["fl"]), feeds)[0]
    np.testing.assert_allclose(rep.run([x], last_layers=7)[0], gp, rtol=1e-5, atol=1e-6)  # node 7: the global pool
    # SINGA counts a negative k as node (k + 1) mod n: -4 is node n - 3, the reshape before the Gemm (the
    # model zoo's classifiers end in their Gemm, so SINGA's examples take -3 for the reshape there)
    np.testing.assert_allclose(rep.run([x], last_layers=-4)[0], fl, rtol=1e-5, atol=1e-6)
    assert (-4 + 1) % n == 8
    prob, aux = rep.run([x], aux_output=("gp",))
    np.testing.assert_allclose(aux, gp, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="outside the graph"):
        rep.run([x], last_layers=n)
    with pytest.raises(ValueError, match="takes 1 input"):
        rep.run([x, x])
    with pytest.raises(KeyError, match="no value named nowhere"):
        rep.run([x], aux_output=("nowhere",))


def _with_outputs(m, names):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    del out.graph.output[:]
    out.graph.output.extend([h.make_tensor_value_info(n, out.graph.input[0].type.tensor_type.elem_type, None)
                             for n in names])
    return out


class Head(sonnx.SONNXModel):
    """SINGA's transfer-learning pattern (examples/onnx/training): the graph cut before its classifier,
    a new Linear layer on top."""

    def __init__(self, onnx_model, classes):
        super().__init__(onnx_model)
        self.linear = layer.Linear(classes)

    def forward(self, *x):
        return self.linear(super().forward(*x, last_layers=-4)[0])  # the features before the Gemm

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


def test_parameter_gradients_match_finite_differences():
    m, feeds = cnn(np.float64)
    inits = {t.name: nh.to_array(t) for t in m.graph.initializer}

    class Whole(sonnx.SONNXModel):
        def forward(self, *x):
            return super().forward(*x)[0]

    net = Whole(m)
    x = tensor.from_numpy(feeds["x"], dtype=tensor.float64)
    net.compile([x], is_train=False)
    assert sorted(net.get_params()) == [f"weights.{k}" for k in ("b1", "be", "fc", "fcb", "g", "w1", "w2")]
    assert sorted(set(net.get_states()) - set(net.get_params())) == ["weights.mu", "weights.var"]
    coef = np.random.default_rng(5).standard_normal((2, 5))
    y = net.forward(x)
    loss = autograd.reduce_sum(y * tensor.from_numpy(coef, dtype=tensor.float64), [0, 1], keepdims=0)
    grads = {p.name: g.to_numpy() for p, g in autograd.backward(loss)}

    def objective(name, value):
        changed = onnx.ModelProto()
        changed.CopyFrom(m)
        for t in changed.graph.initializer:
            if t.name == name:
                t.CopyFrom(nh.from_array(value, name))
        return float((reference(changed, feeds)[0] * coef).sum())

    for name in ("w1", "g", "w2", "fc"):
        base = inits[name]
        g = grads[f"weights.{name}"]
        for i in list(np.ndindex(base.shape))[:: max(1, base.size // 6)]:
            hi, lo = base.copy(), base.copy()
            hi[i] += 1e-6
            lo[i] -= 1e-6
            numeric = (objective(name, hi) - objective(name, lo)) / 2e-6
            assert g[i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, i)


def test_a_new_head_trains_and_batch_norm_statistics_move():
    m, feeds = cnn()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 3, 11, 9)).astype(np.float32)
    labels = (x[:, 0].mean((1, 2)) > 0).astype(np.int32)  # learnable from the input
    dev = tandem.device.get_default_device()
    dev.SetRandSeed(0)
    net = Head(m, 2)
    tx, ty = tensor.from_numpy(x, dev), tensor.from_numpy(labels, dev)
    net.set_optimizer(opt.SGD(lr=0.2, momentum=0.9))
    net.compile([tx], is_train=True)
    mu0 = net.get_states()["weights.mu"].to_numpy().copy()
    w0 = net.get_params()["weights.w1"].to_numpy().copy()
    losses = [float(net(tx, ty)[1].to_numpy()[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(net.get_states()["weights.mu"].to_numpy(), mu0)  # training mode: batch statistics
    assert not np.allclose(net.get_params()["weights.w1"].to_numpy(), w0)  # the graph's weights train too
    assert "linear.weight" in net.get_params()
    net.eval()
    out = net(tx).to_numpy()
    assert out.shape == (16, 2) and np.isfinite(out).all()


def test_unsupported_operators_are_refused():
    m = model([N("Einsum", ["x", "x"], ["y"], equation="ij,ij->i")], [("x", [2, 2])], ["y"], {}, 12)
    with pytest.raises(NotImplementedError, match="Einsum"):
        sonnx.prepare(m)
    bad = model([N("Reshape", ["x", "s"], ["y"])], [("x", [2, 3])], ["y"], {"s": np.array([4, -1], np.int64)}, 13)
    with pytest.raises(Exception) as info:
        sonnx.prepare(bad).run([np.ones((2, 3), np.float32)])
    assert any("Reshape" in note for note in getattr(info.value, "__notes__", [])), info.value


def test_files_load(tmp_path):
    m, feeds = cnn()
    path = tmp_path / "cnn.onnx"
    sonnx.save(m, str(path))
    np.testing.assert_allclose(sonnx.prepare(str(path)).run([feeds["x"]])[0], reference(m, feeds)[0], rtol=1e-5,
                               atol=1e-6)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(path.read_bytes()[:100] + b"\xff" * 64)  # cut and garbled
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        sonnx.prepare(str(bad))
    with pytest.raises(FileNotFoundError):
        sonnx.prepare(str(tmp_path / "missing.onnx"))


FIXTURES = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures" / "onnx"


@pytest.mark.parametrize("name", ["cnn", "attention"])
def test_pytorch_exports_run_and_back_propagate_as_pytorch(name):
    """Models exported by torch.onnx.export (tests/fixtures/make_onnx.py): PyTorch's output, and its gradient
    of sum(output * c) with respect to the input, through a SONNXModel."""
    e = np.load(FIXTURES / "expected.npz")
    path = str(FIXTURES / f"{name}.onnx")
    np.testing.assert_allclose(sonnx.prepare(path).run([e[f"{name}_x"]])[0], e[f"{name}_y"], rtol=1e-5, atol=1e-6)

    class Whole(sonnx.SONNXModel):
        def forward(self, *x):
            return super().forward(*x)[0]

    net = Whole(onnx.load(path))
    x = tensor.Tensor(e[f"{name}_x"].shape, requires_grad=True, stores_grad=True)
    x.copy_from_numpy(e[f"{name}_x"])
    net.compile([x], is_train=False)
    y = net.forward(x)
    np.testing.assert_allclose(y.to_numpy(), e[f"{name}_y"], rtol=1e-5, atol=1e-6)
    loss = autograd.reduce_sum(y * tensor.from_numpy(e[f"{name}_c"]), list(range(y.dim())), keepdims=0)
    pairs = list(autograd.backward(loss))
    assert x.grad is not None and len(pairs) == len(net.get_params()) + 1  # every weight, and the input
    np.testing.assert_allclose(x.grad.to_numpy(), e[f"{name}_dx"], rtol=1e-4, atol=1e-6)


def test_constants_are_put_on_the_device_once():
    """The attention graph's folded constants (shapes, the causal mask) are made once and reused; inputs are
    never kept."""
    e = np.load(FIXTURES / "expected.npz")
    rep = sonnx.prepare(str(FIXTURES / "attention.onnx"))
    rep.run([e["attention_x"]])
    kept = len(rep._constants)
    assert kept > 0
    for i in range(3):
        y = rep.run([e["attention_x"] * (i + 2)])[0]
        assert np.isfinite(y).all()
    assert len(rep._constants) == kept


def test_run_node_as_the_backend_api():
    x = np.random.default_rng(9).standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = np.random.default_rng(10).standard_normal((3, 2, 3, 3)).astype(np.float32)
    node = N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    out = sonnx.run_node(node, [x, w])
    assert list(out) == ["y"]
    want = reference(model([node], [("x", [1, 2, 5, 5]), ("w", [3, 2, 3, 3])], ["y"], {}, 13), {"x": x, "w": w})[0]
    np.testing.assert_allclose(out["y"].to_numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="takes 2 input"):
        sonnx.run_node(node, [x])


@pytest.mark.skipif(tandem.device.get_num_gpus() == 0, reason="no CUDA GPU")
def test_a_graph_on_a_gpu_matches_the_cpu_and_trains():
    e = np.load(FIXTURES / "expected.npz")
    gpu = tandem.device.create_cuda_gpu_on(0)
    for name in ("cnn", "attention"):
        rep = sonnx.prepare(str(FIXTURES / f"{name}.onnx"), gpu)
        x = tensor.from_numpy(e[f"{name}_x"], gpu)
        np.testing.assert_allclose(rep.run([x])[0], e[f"{name}_y"], rtol=1e-3, atol=1e-4)  # TF32 products
    m, _ = cnn()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 3, 11, 9)).astype(np.float32)
    labels = (x[:, 0].mean((1, 2)) > 0).astype(np.int32)
    net = Head(m, 2)
    tx, ty = tensor.from_numpy(x, gpu), tensor.from_numpy(labels, gpu)
    net.set_optimizer(opt.SGD(lr=0.2, momentum=0.9))
    net.compile([tx], is_train=True, use_graph=True)
    losses = [float(net(tx, ty)[1].to_numpy()[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
