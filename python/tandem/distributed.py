"""Joining a job: the multiprocessing ticket and the launcher's view of this process."""
import os
import secrets
import sys

from . import _tandem

detect_env = _tandem.detect_env
check_agreement = _tandem.check_agreement
report_step = _tandem.report_step


class NcclIdHolder:
    """The ticket of a job whose processes are started with ``multiprocessing``.

    The parent makes one ticket per job and passes it to each process, which hands it to
    ``opt.DistOpt(sgd, nccl_id=ticket, local_rank=i, world_size=n)``. The ticket carries the address
    of a rendezvous store that the parent serves on 127.0.0.1 for as long as the ticket lives, the
    job's id, and the secret by which the job's processes prove to the store that they belong to it;
    the ranks meet there and connect NCCL (GPUs) or Gloo (CPUs). It pickles, so it also works with
    the 'spawn' and 'forkserver' start methods; keep it from processes outside the job.
    """

    def __init__(self):
        self.job_id = "multiprocessing-" + secrets.token_hex(8)
        self._secret = secrets.token_hex(32)
        self._server = _tandem.StoreServer("127.0.0.1", self.job_id, self._secret)
        self.address = f"127.0.0.1:{self._server.port}"

    def __getstate__(self):
        # The server stays with the process that made it.
        return {"address": self.address, "job_id": self.job_id, "secret": self._secret}

    def __setstate__(self, state):
        self.address, self.job_id, self._secret = state["address"], state["job_id"], state["secret"]
        self._server = None

    def __repr__(self):
        return f"NcclIdHolder('{self.address}', job '{self.job_id}')"

    def environment(self, local_rank, world_size):
        """The launch variables that make a process rank ``local_rank`` of ``world_size`` of this job."""
        if not 0 <= local_rank < world_size:
            raise ValueError(f"local_rank {local_rank} is out of range for world_size {world_size}")
        return {"TANDEM_RANK": str(local_rank), "TANDEM_WORLD_SIZE": str(world_size),
                "TANDEM_LOCAL_RANK": str(local_rank), "TANDEM_LOCAL_SIZE": str(world_size),
                "TANDEM_STORE_ADDR": self.address, "TANDEM_JOB_ID": self.job_id, "TANDEM_SECRET": self._secret}

    def _enter(self, local_rank, world_size):
        """Makes this process rank ``local_rank`` of ``world_size``, meeting at the ticket's store."""
        os.environ.update(self.environment(local_rank, world_size))
        os.environ.pop("TANDEM_SECRET_FILE", None)
        env = detect_env()
        if (env.rank, env.world_size) != (local_rank, world_size):
            raise RuntimeError(f"this process already belongs to a job as rank {env.rank} of {env.world_size} "
                               f"({env.launcher}): a ticket must be used before anything else joins a job, "
                               "once per process")
        return env


_abort_hook_installed = False


def _abort_job_on_uncaught_error():
    """Under mpiexec an uncaught exception stops every rank: the others would wait for this one."""
    global _abort_hook_installed
    if _abort_hook_installed:
        return
    _abort_hook_installed = True
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        _tandem.abort_job_after_error(1)

    sys.excepthook = hook
