"""SINGA's ``singa_wrap`` (its compiled module), for scripts that import it: ``NcclIdHolder``, the
multiprocessing ticket."""
from .distributed import NcclIdHolder

__all__ = ["NcclIdHolder"]
