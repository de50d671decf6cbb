"""Every DistOpt method on the ranks of a job, each result checked against the value computed from all
ranks' inputs. Run by test_distopt.py under `tandem launch -n 2`; prints "rank R ok NAME" per check."""
import sys

import numpy as np

from tandem import _tandem, layer, model, opt, tensor

LR = 0.1
N = 8


class Weights(model.Model):
    """One parameter w; loss = sum(w * x), so the gradient of w is x."""

    def __init__(self, w0):
        super().__init__()
        self.w = self.register_param("w", tensor.from_numpy(w0))

    def forward(self, x):
        return _tandem.sum(_tandem.mul(self.w, x))


def inputs(rank, step=0):
    return np.random.RandomState(100 * step + rank).standard_normal(N).astype(np.float32)


W0 = np.linspace(-1, 1, N).astype(np.float32)


def setup(rank, **dist_args):
    sgd = opt.DistOpt(opt.SGD(lr=LR), **dist_args)
    net = Weights(W0)
    net.set_optimizer(sgd)
    net.compile([tensor.from_numpy(inputs(rank))])
    return sgd, net


def step(sgd, net, rank, how, s=0, **kw):
    loss = net.forward(tensor.from_numpy(inputs(rank, s)))
    getattr(sgd, how)(loss, **kw) if how != "__call__" else sgd(loss)


def check(rank, name, got, expected, atol=1e-6):
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol, err_msg=name)
    print(f"rank {rank} ok {name}", flush=True)


def sparse_expectation(world, steps, select, corr):
    """Parameters after `steps` sparse steps: each rank sends select(acc) of its accumulated gradient."""
    w = W0.astype(np.float64)
    residual = [np.zeros(N) for _ in range(world)]
    for s in range(steps):
        total = np.zeros(N)
        for r in range(world):
            acc = inputs(r, s) + (residual[r] if corr else 0)
            mask = select(acc)
            total += np.where(mask, acc, 0)
            residual[r] = np.where(mask, 0, acc)
        w -= LR * total / world
    return w


def main():
    sgd = opt.DistOpt(opt.SGD(lr=LR))
    rank, world = sgd.rank_in_global, sgd.world_size
    assert world == 2 and sgd.global_rank == rank and sgd.rank_in_local == sgd.local_rank == rank, vars(sgd._env)
    mean_x = np.mean([inputs(r) for r in range(world)], axis=0)

    # all_reduce and wait: the guide's synchronize() and reduce_variable() helpers
    t = tensor.full((3,), rank + 1.0)
    sgd.all_reduce(t.data)
    sgd.wait()
    check(rank, "all_reduce", t.to_numpy(), np.full(3, world * (world + 1) / 2))
    t /= sgd.world_size
    check(rank, "synchronize", t.to_numpy(), np.full(3, (world + 1) / 2))
    # The guide's synchronize() divides right after all_reduce, without wait(): the sum must be there.
    big = tensor.full((1 << 18,), rank + 1.0)
    sgd.all_reduce(big.data)
    check(rank, "all_reduce without wait", big.to_numpy(), np.full(1 << 18, world * (world + 1) / 2))
    for p in (tensor.full((3,), rank + 1.0), tensor.full((1 << 18,), rank + 1.0)):
        sgd.all_reduce(p.data)
        p /= sgd.world_size
        check(rank, "synchronize without wait", p.to_numpy(), np.full(p.shape, (world + 1) / 2))

    for how in ("__call__", "backward_and_update"):
        d, net = setup(rank)
        step(d, net, rank, how)
        check(rank, how, net.get_params()["w"].to_numpy(), W0 - LR * mean_x)
        d.check_consistency()
        assert d.stats.bytes_sent > 0 and d.stats.steps == 1

    net.get_params()["w"].copy_from_numpy(np.full(N, float(rank), dtype=np.float32))
    d.sync_parameters()  # rank 0's values everywhere
    check(rank, "sync_parameters", net.get_params()["w"].to_numpy(), np.zeros(N))

    d, net = setup(rank)
    step(d, net, rank, "backward_and_update_half")
    check(rank, "backward_and_update_half", net.get_params()["w"].to_numpy(), W0 - LR * mean_x, atol=2e-3)
    d, net = setup(rank)
    step(d, net, rank, "backward_and_update_half", clipping=True, clip_Value=0.5)
    clipped = np.mean([np.clip(inputs(r), -0.5, 0.5) for r in range(world)], axis=0)
    check(rank, "backward_and_update_half clipping", net.get_params()["w"].to_numpy(), W0 - LR * clipped, atol=2e-3)

    d, net = setup(rank)
    step(d, net, rank, "backward_and_partial_update")  # a local step, then the (only) chunk averaged
    check(rank, "backward_and_partial_update", net.get_params()["w"].to_numpy(), W0 - LR * mean_x)
    d.average_parameters()
    d.check_consistency()

    # The step split around the synchronisation, the global-norm clip, and accumulation without communication.
    d, net = setup(rank)
    d.backward_and_sync(net.forward(tensor.from_numpy(inputs(rank))))
    check(rank, "backward_and_sync", net.get_params()["w"].grad.to_numpy(), mean_x)
    norm = d.clip_grad_norm(0.5 * np.linalg.norm(mean_x))
    check(rank, "clip_grad_norm", norm.to_numpy().reshape(()), np.linalg.norm(mean_x), atol=1e-5)
    assert d.update() is True
    scale = 0.5 * np.linalg.norm(mean_x) / (np.linalg.norm(mean_x) + 1e-6)
    check(rank, "update", net.get_params()["w"].to_numpy(), W0 - LR * scale * mean_x)
    d, net = setup(rank)
    with d.no_sync():
        d.backward_and_sync(net.forward(tensor.from_numpy(inputs(rank, 0))))
    d.backward_and_sync(net.forward(tensor.from_numpy(inputs(rank, 1))))
    d.update()
    both = np.mean([inputs(r, 0) + inputs(r, 1) for r in range(world)], axis=0)
    check(rank, "no_sync", net.get_params()["w"].to_numpy(), W0 - LR * both, atol=1e-5)
    d, net = setup(rank, dist_option="powerSGD", powersgd_rank=1)
    step(d, net, rank, "__call__")  # a vector travels uncompressed: the plain average
    check(rank, "powerSGD", net.get_params()["w"].to_numpy(), W0 - LR * mean_x)
    assert d.stats.steps == 1 and len(d.residual_norms()) == 1 and d.bucket_layout()[0].numel == N

    k = 2  # spars 0.25 of 8 gradients
    top_k = lambda acc: np.abs(acc) >= np.sort(np.abs(acc))[-k]  # noqa: E731
    d, net = setup(rank)
    for s in range(3):
        step(d, net, rank, "backward_and_sparse_update", s, spars=0.25, topK=True, corr=True)
    check(rank, "backward_and_sparse_update topK corr", net.get_params()["w"].to_numpy(),
          sparse_expectation(world, 3, top_k, True), atol=1e-5)
    d, net = setup(rank)
    for s in range(2):
        step(d, net, rank, "backward_and_sparse_update", s, spars=0.7, topK=False, corr=False)
    check(rank, "backward_and_sparse_update threshold", net.get_params()["w"].to_numpy(),
          sparse_expectation(world, 2, lambda acc: np.abs(acc) >= 0.7, False), atol=1e-5)

    # SINGA's defaults and positional order: backward_and_sparse_update(loss) is the threshold method with
    # spars 0.05 and error feedback, as C++'s DistOpt::backward_and_sparse_update(loss) (the binding's defaults).
    d, net = setup(rank)
    dc, netc = setup(rank)
    for s in range(2):
        d.backward_and_sparse_update(net.forward(tensor.from_numpy(inputs(rank, s))))
        dc._impl.backward_and_sparse_update(netc.forward(tensor.from_numpy(inputs(rank, s))))
    check(rank, "backward_and_sparse_update defaults", net.get_params()["w"].to_numpy(),
          sparse_expectation(world, 2, lambda acc: np.abs(acc) >= 0.05, True), atol=1e-5)
    check(rank, "backward_and_sparse_update defaults as C++'s", net.get_params()["w"].to_numpy(),
          netc.get_params()["w"].to_numpy(), atol=0)
    d, net = setup(rank)
    for s in range(2):
        d.backward_and_sparse_update(net.forward(tensor.from_numpy(inputs(rank, s))), 2097152, 0.25, True, False)
    check(rank, "backward_and_sparse_update positional", net.get_params()["w"].to_numpy(),
          sparse_expectation(world, 2, top_k, False), atol=1e-5)
    d, net = setup(rank)
    d.backward_and_update_half(net.forward(tensor.from_numpy(inputs(rank))), 2097152, True, 0.5)
    check(rank, "backward_and_update_half positional", net.get_params()["w"].to_numpy(), W0 - LR * clipped, atol=2e-3)

    # SINGA's helpers on lists of tensors: sums over the ranks, finished by wait().
    vals = lambda r, n, s=0: np.arange(n, dtype=np.float32) * (r + 1) + s  # noqa: E731  (exact in float16)
    total = lambda n, s=0: sum(vals(r, n, s) for r in range(world))  # noqa: E731
    a, b = tensor.from_numpy(vals(rank, 4).reshape(2, 2)), tensor.from_numpy(vals(rank, 3, 1))
    sgd.fused_all_reduce([a], send=False)
    sgd.fused_all_reduce([b], send=False)
    sgd.fused_all_reduce([a, b])
    sgd.wait()
    check(rank, "fused_all_reduce", np.concatenate([a.to_numpy().ravel(), b.to_numpy()]),
          np.concatenate([total(4), total(3, 1)]))
    a, b = tensor.from_numpy(vals(rank, 4)), tensor.from_numpy(vals(rank, 5, 2))
    sgd.all_reduce_half(a)
    sgd.fused_all_reduce_half([b])
    sgd.wait()
    check(rank, "all_reduce_half", a.to_numpy(), total(4))
    check(rank, "fused_all_reduce_half", b.to_numpy(), total(5, 2))
    # Sparsification: each rank's selection from tensor + accumulation, summed; what was not sent stays.
    g = lambda r: inputs(r, 7)  # noqa: E731
    t, acc = tensor.from_numpy(g(rank)), tensor.from_numpy(np.full(N, 0.1 * (rank + 1), np.float32))
    sgd.sparsification(t, acc, 0.25, True)
    sgd.wait()
    xs = [g(r) + np.float32(0.1 * (r + 1)) for r in range(world)]
    check(rank, "sparsification", t.to_numpy(), sum(np.where(top_k(x), x, 0) for x in xs), atol=1e-6)
    check(rank, "sparsification accumulation", acc.to_numpy(), np.where(top_k(xs[rank]), 0, xs[rank]), atol=1e-6)
    p, q = tensor.from_numpy(g(rank)[:3]), tensor.from_numpy(g(rank)[3:].reshape(1, N - 3))
    sgd.fused_sparsification([p, q], None, 0.7, False)
    sgd.wait()
    check(rank, "fused_sparsification", np.concatenate([p.to_numpy(), q.to_numpy().ravel()]),
          sum(np.where(np.abs(g(r)) >= 0.7, g(r), 0) for r in range(world)), atol=1e-6)
    # update(param, grad): SINGA's: this rank's gradient, which wait() made a sum, divided by the world size.
    d, net = setup(rank)
    w = net.get_params()["w"]
    grad = tensor.from_numpy(inputs(rank))
    d.all_reduce(grad)
    d.wait()
    d.update(w, grad)
    check(rank, "update(param, grad)", w.to_numpy(), W0 - LR * mean_x)

    # Parameters found from the loss's graph (no model given).
    d = opt.DistOpt(opt.SGD(lr=LR))
    lin = layer.Linear(N, 1)
    lin(tensor.from_numpy(inputs(rank).reshape(1, N)))
    w_before = lin.W.to_numpy()
    d(lin(tensor.from_numpy(inputs(rank).reshape(1, N))).reshape((1,)))
    check(rank, "parameters from the graph", lin.W.to_numpy(), w_before - LR * mean_x.reshape(1, N), atol=1e-6)

    # Buffers: batch-norm statistics of different batches differ until averaged.
    class Norm(model.Model):
        def __init__(self):
            super().__init__()
            self.bn = layer.BatchNorm2d(2)

        def forward(self, x):
            return _tandem.sum(self.bn(x))

    d = opt.DistOpt(opt.SGD(lr=LR))
    net = Norm()
    net.set_optimizer(d)
    x = tensor.from_numpy(np.random.RandomState(rank).standard_normal((4, 2, 3, 3)).astype(np.float32))
    d(net.forward(x))  # the first step starts all ranks from rank 0's state
    d(net.forward(x))
    try:
        d.check_consistency(include_buffers=True)
        raise AssertionError("running statistics of different batches compared equal")
    except ValueError as e:
        assert "bn.running_mean" in str(e), e
    d.average_buffers()
    d.check_consistency(include_buffers=True)
    print(f"rank {rank} ok average_buffers", flush=True)

    # Sync batch norm: training statistics over both ranks' samples, so running statistics agree.
    d = opt.DistOpt(opt.SGD(lr=LR))
    net = Norm()
    net.set_optimizer(d)
    net.compile([x])
    assert d.convert_sync_batch_norm(net) == 1
    for _ in range(2):
        d(net.forward(x))
    d.check_consistency(include_buffers=True)
    print(f"rank {rank} ok convert_sync_batch_norm", flush=True)

    # Uneven inputs: rank r has 1 + 2r batches, a learning rate that halves each step (a schedule of the
    # step count, which a joined rank's steps follow too), and ends with join(); each step applies the
    # average over the ranks that still had a batch, on every rank.
    batches = [1 + 2 * r for r in range(world)]
    for shard in ("none", "optimizer", "gradients"):
        d = opt.DistOpt(opt.SGD(lr=opt.ExponentialDecay(LR, 1, 0.5)), uneven_inputs=True, shard=shard)
        net = Weights(W0)
        net.set_optimizer(d)
        net.compile([tensor.from_numpy(inputs(rank))])
        for s in range(batches[rank]):
            step(d, net, rank, "__call__", s)
        took_part = d.join()
        assert took_part == max(batches) - batches[rank], (shard, took_part)
        w = W0.astype(np.float64)
        for s in range(max(batches)):
            active = [r for r in range(world) if s < batches[r]]
            w -= LR * 0.5 ** s * np.mean([inputs(r, s) for r in active], axis=0)
        check(rank, f"uneven inputs --shard {shard}", net.get_params()["w"].to_numpy(), w, atol=1e-5)
        d.check_consistency()
        memory = d.memory_report()
        assert memory["total"] == memory["parameters"] + memory["gradients"] + memory["optimizer_state"], memory

    # Master weights: the parameters hold bfloat16 values while the optimizer steps float32 masters (4 bytes a
    # parameter, once over the ranks when sharded); sharded or not, the same parameters.
    def bf16_rounding(a):
        u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)

    ends = {}
    for shard in ("none", "optimizer", "gradients"):
        d = opt.DistOpt(opt.SGD(lr=LR, momentum=0.9), shard=shard, master_weights=tensor.bfloat16)
        net = Weights(W0)
        net.set_optimizer(d)
        net.compile([tensor.from_numpy(inputs(rank))])
        for s in range(3):
            step(d, net, rank, "__call__", s)
        w = net.get_params()["w"].to_numpy()
        assert np.array_equal(w, bf16_rounding(w)), (shard, w)
        memory = d.memory_report()
        kept = memory["master_weights"]
        assert kept == 4 * N if shard == "none" else 0 < kept < 4 * N, (shard, memory)
        ends[shard] = w
    for shard in ("optimizer", "gradients"):
        check(rank, f"master weights --shard {shard}", ends[shard], ends["none"], atol=0)
    assert not np.array_equal(ends["none"], W0), "master weights: nothing stepped"
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
