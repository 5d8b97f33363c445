"""Orchard's errors as the exceptions Harbor's trial runner knows.

Harbor classifies a failed trial by the exception's class *name*
(``harbor.models.trial.error_policy``): whether it is retried and whether its reward
counts. So the name we raise decides whether a sample is dropped:

- an infrastructure failure (``orchard.InfrastructureError``, the sandbox gone or not
  ready) becomes Harbor's ``HealthcheckError``, one of its "sandbox failed" names
  (retried, not graded). Left as it is, Orchard's ``ServiceUnavailableError`` would be
  read as LiteLLM's class of the same name, a model-provider failure that *is* graded;
- a timeout becomes the builtin ``TimeoutError``, which Harbor's trial turns into its
  ``AgentTimeoutError`` / ``VerifierTimeoutError`` for the phase that ran it;
- a missing path becomes ``FileNotFoundError``, a refused one ``PermissionError``;
- anything else (a bad request, a configuration or key problem) stays the Orchard
  error it is, with its message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from harbor.environments.base import HealthcheckError

import orchard


@contextmanager
def harbor_errors(what: str) -> Iterator[None]:
    """Re-raise Orchard errors from ``what`` (e.g. ``"exec"``) as Harbor expects them."""
    try:
        yield
    except (orchard.InfrastructureError, orchard.SandboxNotFoundError) as exc:
        raise HealthcheckError(f"Orchard sandbox unavailable during {what}: {exc}") from exc
    except orchard.SandboxNotReadyError as exc:
        raise HealthcheckError(f"Orchard sandbox not ready for {what}: {exc}") from exc
    except orchard.DeadlineExceededError as exc:
        raise TimeoutError(f"Orchard {what} timed out: {exc}") from exc
    except orchard.PathNotFoundError as exc:
        raise FileNotFoundError(f"{what}: {exc}") from exc
    except orchard.PermissionDeniedError as exc:
        raise PermissionError(f"{what}: {exc}") from exc
