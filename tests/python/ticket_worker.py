"""A rank started by multiprocessing: joins through the ticket, sums its rank + 1 with the others."""
from tandem import opt, tensor


def reduce_rank(nccl_id, gpu_num, gpu_per_node, results):
    sgd = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=nccl_id, gpu_num=gpu_num, gpu_per_node=gpu_per_node, timeout=60)
    t = tensor.full((2,), sgd.rank_in_global + 1.0)
    sgd.all_reduce(t)
    sgd.wait()
    results.put((sgd.rank_in_global, sgd.world_size, t.to_numpy().tolist()))
