"""Joining a job: the multiprocessing ticket and the launcher's view of this process."""
import os

from . import _tandem

detect_env = _tandem.detect_env


class NcclIdHolder:
    """The ticket of a job whose processes are started with ``multiprocessing``.

    The parent makes one ticket per job and passes it to each process, which hands it to
    ``opt.DistOpt(sgd, nccl_id=ticket, local_rank=i, world_size=n)``. The ticket carries the address
    of a rendezvous store that the parent serves on 127.0.0.1 for as long as the ticket lives; the
    ranks meet there and connect NCCL (GPUs) or Gloo (CPUs). It pickles, so it also works with the
    'spawn' and 'forkserver' start methods.
    """

    def __init__(self):
        self._server = _tandem.StoreServer("127.0.0.1")
        self.address = f"127.0.0.1:{self._server.port}"

    def __getstate__(self):
        return {"address": self.address}  # the server stays with the process that made it

    def __setstate__(self, state):
        self.address = state["address"]
        self._server = None

    def __repr__(self):
        return f"NcclIdHolder('{self.address}')"

    def _enter(self, local_rank, world_size):
        """Makes this process rank ``local_rank`` of ``world_size`` on this host, meeting at the ticket's store."""
        if not 0 <= local_rank < world_size:
            raise ValueError(f"local_rank {local_rank} is out of range for world_size {world_size}")
        os.environ.update(TANDEM_RANK=str(local_rank), TANDEM_WORLD_SIZE=str(world_size),
                          TANDEM_LOCAL_RANK=str(local_rank), TANDEM_LOCAL_SIZE=str(world_size),
                          TANDEM_STORE_ADDR=self.address)
        env = detect_env()
        if (env.rank, env.world_size) != (local_rank, world_size):
            raise RuntimeError(f"this process already belongs to a job as rank {env.rank} of {env.world_size} "
                               f"({env.launcher}): a ticket must be used before anything else joins a job, "
                               "once per process")
        return env
