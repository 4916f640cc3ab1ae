"""Every Hub request this project makes, with a timeout, retries and one-line errors; offline, what the Hub cache
lacks of a model, named before loading.

`huggingface_hub`'s own client waits forever for a server that accepted the connection and never answers (only its
file downloads set their own timeouts). `use_hub_timeouts()` gives every request of the process a timeout
(`HUB_TIMEOUT_ENV`, default 60 s; 10 s to connect); the library calls it before it first reaches the Hub, for a push
(`hub_call`), a model or tokenizer loaded by name (`modeling.translation`, `modeling.training`) and a Hub dataset
(`modeling.data`). Pushes are retried a few times with backoff on timeouts, connection errors, 5xx, 408 and 429 answers
(safe: a commit is atomic on the Hub and uploaded objects are content-addressed), and a failure ends in `HubError`,
one line naming the URL and the cause.

Offline (HF_HUB_OFFLINE=1), `offline_cache_error` names what the cache lacks of a model repo (`MODEL_REPO_FILES`:
its config, weights, tokenizer) or that only other revisions are there, with the command that downloads it; the
loaders call it before transformers would fail with messages that name neither the cache nor the file.
"""

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import (
    HfApi,
    constants,
    file_exists,
    hf_hub_download,
    is_offline_mode,
    set_client_factory,
    try_to_load_from_cache,
)
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import _http as hf_http

try:  # huggingface_hub 2.x ships its HTTP client as httpx2; 1.x used httpx
    import httpx2
except ImportError:  # pragma: no cover - huggingface_hub 1.x
    import httpx as httpx2

logger = logging.getLogger(__name__)

# Seconds a Hub request may wait for an answer (and at most CONNECT_TIMEOUT of them to connect).
HUB_TIMEOUT_ENV = "VASWANI_HUB_TIMEOUT"
# How many times a Hub call is tried before it fails (timeouts, connection errors, 5xx, 408 and 429 answers).
HUB_ATTEMPTS_ENV = "VASWANI_HUB_ATTEMPTS"
DEFAULT_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0
DEFAULT_ATTEMPTS = 3
FIRST_BACKOFF = 1.0  # seconds before the second attempt, doubled for each further one

T = TypeVar("T")


class HubError(OSError):
    """A Hub request failed (timeout, no connection, an error answer): one line naming the URL and the cause."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


def _positive_setting(name: str, default: float, kind: type) -> float:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < math.inf:  # float() also reads "nan" and "inf"
        raise ValueError(
            f"{name} must be a positive{', finite' if kind is float else ''} {kind.__name__}, got {text!r}."
        )
    return value


def hub_timeout() -> float:
    """Seconds a Hub request may wait: $VASWANI_HUB_TIMEOUT, else 60."""
    return _positive_setting(HUB_TIMEOUT_ENV, DEFAULT_TIMEOUT, float)


def hub_attempts() -> int:
    """Tries per Hub call: $VASWANI_HUB_ATTEMPTS, else 3."""
    return int(_positive_setting(HUB_ATTEMPTS_ENV, DEFAULT_ATTEMPTS, int))


def _bounding_timeouts(client: httpx2.Client, seconds: float) -> httpx2.Client:
    """`client` with every request's limits bounded by `seconds`, 10 s at most to connect."""
    limits = httpx2.Timeout(seconds, connect=min(CONNECT_TIMEOUT, seconds)).as_dict()

    def bound_timeouts(request: httpx2.Request) -> None:
        # A client's default timeout only covers requests that name none: huggingface_hub passes `timeout=None`
        # explicitly on some (`model_info`, which `from_pretrained` calls first), which means "wait forever", and
        # its download retries wait 60 s each. Every limit becomes at most ours.
        chosen = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {name: min(chosen.get(name) or limit, limit) for name, limit in limits.items()}

    hooks = client.event_hooks
    client.event_hooks = {**hooks, "request": [*hooks.get("request", []), bound_timeouts]}
    return client


def use_hub_timeouts() -> None:
    """Make every `huggingface_hub` request of this process wait at most `hub_timeout()` (read now).

    The clients still come from the factory in place (a user's own `set_client_factory`, for a proxy or
    certificates, stays in force): each one it makes gains the bound.

    Where the same bound is in place already (an earlier call), nothing is done: setting a factory closes
    huggingface_hub's shared client, and every transfer under way on it, so that another thread's download failed
    (`ReadError: [Errno 9] Bad file descriptor`) when this thread loaded a model by name."""
    factory = getattr(hf_http, "_GLOBAL_CLIENT_FACTORY", None) or hf_http.default_client_factory
    seconds = hub_timeout()
    if getattr(factory, "bounded_to", None) == seconds:
        return
    factory = getattr(factory, "wrapped_factory", factory)  # another bound: bound the same factory anew

    def bounded_factory() -> httpx2.Client:
        return _bounding_timeouts(factory(), seconds)

    bounded_factory.wrapped_factory = factory
    bounded_factory.bounded_to = seconds
    set_client_factory(bounded_factory)


def _request_of(error: BaseException) -> str:
    try:
        request = error.response.request if isinstance(error, HfHubHTTPError) else error.request
        return f"{request.method} {request.url}"
    except (AttributeError, RuntimeError):
        return "the Hub"


def _retriable(error: BaseException) -> bool:
    if isinstance(error, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)):
        return True
    status = getattr(getattr(error, "response", None), "status_code", None)
    # The answers a later try can change: a server's error, a request timeout, too many requests (huggingface_hub's
    # own backoff retries 408 and 429 too)
    return isinstance(error, HfHubHTTPError) and status is not None and (status >= 500 or status in (408, 429))


def _one_line(error: BaseException, attempts: int) -> str:
    where = _request_of(error)
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    if isinstance(error, httpx2.TimeoutException):
        return (
            f"{where}: no answer within {hub_timeout():g} s{tries}; a slow network may need a larger "
            f"{HUB_TIMEOUT_ENV} (seconds)"
        )
    if isinstance(error, httpx2.TransportError):
        return f"{where}: cannot connect ({str(error) or type(error).__name__}){tries}"
    if isinstance(error, HfHubHTTPError):
        response = error.response
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        detail = error.server_message or ""
        hint = " (check the token: HF_TOKEN or `hf auth login`)" if response.status_code in (401, 403) else ""
        return f"{where}: {status}{': ' + detail.splitlines()[0] if detail else ''}{hint}{tries}"
    return f"{where}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def holds_tokenizer(directory: str | os.PathLike) -> bool:
    """Whether a local model directory holds a saved tokenizer (one of `TOKENIZER_FILES`)."""
    return any(os.path.isfile(os.path.join(directory, name)) for name in TOKENIZER_FILES)


# What loading one of this project's models reads from its repo, each entry alternatives of which one will do.
MODEL_REPO_FILES = [("config.json",), ("model.safetensors", "model.safetensors.index.json"), TOKENIZER_FILES]

# Said with every failure to reach the Hub: a compute node without internet reads the cache only when told to.
OFFLINE_HINT = "without internet, set HF_HUB_OFFLINE=1 to load from the cache"


@contextmanager
def naming_hub_failures(what: str) -> Iterator[None]:
    """Inside the block, an `OSError` that a timeout or a failed connection lies behind (transformers and
    huggingface_hub wrap it in errors whose text no longer says which), or such a failure itself (transformers lets
    some through unwrapped), becomes `HubError`: `what`, then the URL and the cause, in one line. (datasets already
    says "Couldn't reach 'NAME' on the Hub (...)", and drops the cause.)"""
    try:
        yield
    except (OSError, httpx2.TransportError) as error:
        cause = _failed_connection(error)
        if cause is None:
            raise
        raise HubError(f"{what}: {_one_line(cause, 1)} ({OFFLINE_HINT})") from error


def _failed_connection(error: BaseException) -> httpx2.TransportError | None:
    """The timeout or failed connection behind `error`, if one is (the error itself, or a cause of it)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, httpx2.TransportError):
        cause = cause.__cause__ or cause.__context__
    return cause


def looks_like_local_path(name: str) -> bool:
    """Hub repo ids are `name` or `namespace/name`; anything else can only be meant as a directory."""
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def _cached(repo_id: str, filename: str, revision: str | None) -> str | None:
    """The cached file's path, or None (not cached, or cached as known not to exist)."""
    path = try_to_load_from_cache(repo_id, filename, revision=revision)
    return path if isinstance(path, str) else None


def has_any_file(repo_id: str, revision: str | None, names: tuple[str, ...]) -> bool:
    """Whether the repo holds one of `names`: in the cache, else (online) on the Hub. A Hub that cannot be reached
    raises (`naming_hub_failures` names it), never "no such file"."""
    if any(_cached(repo_id, name, revision) for name in names):
        return True
    return not is_offline_mode() and any(file_exists(repo_id, name, revision=revision) for name in names)


def missing_from_cache(repo_id: str, revision: str | None, wanted: list[tuple[str, ...]]) -> list[str]:
    """Which of the files `wanted` the Hub cache lacks for `repo_id` at `revision` (None: main), each entry named
    alternatives of which one will do. A sharded `model.safetensors.index.json` counts only with all its shards."""

    def present(filename: str) -> bool:
        path = _cached(repo_id, filename, revision)
        if path is None or not filename.endswith(".index.json"):
            return path is not None
        try:
            shards = set(json.loads(Path(path).read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all(_cached(repo_id, shard, revision) for shard in shards)

    return [" or ".join(names) for names in wanted if not any(present(name) for name in names)]


def pinned_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit that `revision` (None: main) of the Hub repo `repo_id` is at now, for every file of one load to
    come from: transformers resolves the branch anew for each file, so a push landing during a load (a download of
    the weights takes minutes) gave the weights of one model and the tokenizer of the next, without a word.

    Found by downloading config.json, which every load reads first: that also records the branch's commit in the
    cache, which a load by commit would not (and offline loads look the branch up there). Offline, or where the Hub
    does not tell (no such repo or file, no access), `revision` as given: the load then fails naming the cause, as it
    would have. A Hub that cannot be reached: the commit the cache holds of `revision` (HF_HUB_OFFLINE forgotten on
    a node without internet: the load goes on from the cache, as transformers' would), with a warning naming it,
    which may be older than the Hub's; where the cache holds none, the failure raises (`naming_hub_failures` names
    it): the load would wait for the Hub again, through every retry, before failing the same way."""
    if is_offline_mode():
        return revision
    try:
        # force_download: where the Hub cannot be reached, hf_hub_download returns the cache's copy without a word
        # (then fails as "Force download failed", a ValueError, with the failed connection or the Hub's answer as
        # its cause), and an earlier commit than the Hub's was loaded and scored as the repo's
        config = hf_hub_download(repo_id, "config.json", revision=revision, force_download=True)
    except (OSError, ValueError, EntryNotFoundError, httpx2.HTTPError) as error:
        if (failure := _failed_connection(error)) is None:
            return revision
        try:
            config = hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=True)
        except (OSError, ValueError):  # not in the cache
            raise HubError(f"{_one_line(failure, 1)} ({OFFLINE_HINT})") from error
        logger.warning(
            "The Hub cannot be reached (%s): %r loads from the cache, at the commit %s that %s was at when it was "
            "last read, which a later push may have left behind (set HF_HUB_OFFLINE=1 to load from the cache "
            "without asking)",
            _one_line(failure, 1),
            repo_id,
            Path(config).parent.name,
            revision or "main",
        )
    return Path(config).parent.name  # snapshots/<commit>/config.json


def is_commit(revision: str | None) -> bool:
    """Whether `revision` is a full commit sha, which no push moves (a branch or a tag may be moved)."""
    return revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def current_commit(repo_id: str, revision: str | None, repo_type: str) -> str | None:
    """The commit `revision` (None: main) of the Hub repo `repo_id` is at now, asked of the Hub; `revision` where the
    Hub does not say (no such repo or revision, no access: the load names it); None where the Hub cannot be asked
    (offline, a failed connection, a timeout)."""
    if is_commit(revision):
        return revision
    if is_offline_mode():
        return None
    try:
        return HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type).sha
    except HfHubHTTPError:
        return revision
    except (OSError, httpx2.HTTPError) as error:
        logger.warning("The Hub cannot be asked for %s (%s)", repo_id, _one_line(error, 1))
        return None


def cached_commit(repo_id: str, revision: str | None, repo_type: str) -> str | None:
    """The commit `revision` (None: main) of `repo_id` has in the Hub cache (its refs, which a download by branch or
    tag writes), or `revision` itself where it is a commit the cache holds a snapshot of; None otherwise."""
    repo = Path(constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo_id, repo_type=repo_type))
    ref = repo / "refs" / (revision or "main")
    if ref.is_file():
        return ref.read_text(encoding="utf-8").strip()
    return revision if is_commit(revision) and (repo / "snapshots" / revision).is_dir() else None


def cached_snapshot(repo_id: str, commit: str | None, repo_type: str) -> Path | None:
    """The Hub cache's snapshot of `repo_id` at `commit` (None: main's), as `hf download` left it; None where the
    cache holds none."""
    commit = cached_commit(repo_id, commit, repo_type) if not is_commit(commit) else commit
    if commit is None:
        return None
    snapshot = Path(
        constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo_id, repo_type=repo_type), "snapshots", commit
    )
    return snapshot if snapshot.is_dir() else None


def offline_cache_error(repo_id: str, revision: str | None, wanted: list[tuple[str, ...]]) -> FileNotFoundError | None:
    """In offline mode (HF_HUB_OFFLINE=1), the error to raise before loading `repo_id` when the Hub cache lacks any of
    the files `wanted` (see `missing_from_cache`): one line naming the cache, what it lacks and how to download it,
    instead of transformers' "couldn't connect", which blames the network or the repo. None online or when all are
    there."""
    if not is_offline_mode():
        return None
    missing = missing_from_cache(repo_id, revision, wanted)
    if not missing:
        return None
    cache = constants.HF_HUB_CACHE
    download = f"download it where the Hub can be reached, into the same HF_HOME (hf download {repo_id}" + (
        f" --revision {revision})" if revision else ")"
    )
    snapshots = Path(cache, repo_folder_name(repo_id=repo_id, repo_type="model"), "snapshots")
    cached_at_revision = cached_commit(repo_id, revision, repo_type="model") is not None
    if not cached_at_revision and revision is None and snapshots.is_dir() and any(snapshots.iterdir()):
        # `hf download --revision` leaves no main to find
        revisions = ", ".join(sorted(entry.name for entry in snapshots.iterdir()))
        return FileNotFoundError(
            f"The Hub cache {cache} holds {repo_id!r} at the revisions {revisions} only, not its main, and offline "
            "mode (HF_HUB_OFFLINE) keeps it from the Hub: name one as the revision (--revision; train.py: "
            f"--model_revision), or {download}"
        )
    at = f" at revision {revision!r}" if revision else ""
    if cached_at_revision:
        what = f"The Hub cache {cache} holds {repo_id!r}{at} without {', '.join(missing)}"
    else:
        what = f"{repo_id!r}{at} is not in the Hub cache {cache}"
    return FileNotFoundError(f"{what}, and offline mode (HF_HUB_OFFLINE) keeps it from the Hub: {download}")


def hub_call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)`, a `huggingface_hub` call, with timeouts, retries and one-line errors.

    Timeouts, connection errors, 5xx, 408 and 429 answers are retried up to `hub_attempts()` times in all, after
    1, 2, 4, ... seconds; the last failure, and any other HTTP error (401, 403, 404, ...) at once, becomes
    `HubError` naming the URL and the cause."""
    use_hub_timeouts()
    attempts = hub_attempts()
    for attempt in range(1, attempts + 1):
        try:
            return function(*args, **kwargs)
        except (httpx2.HTTPError, HfHubHTTPError) as error:
            if attempt < attempts and _retriable(error):
                wait = FIRST_BACKOFF * 2 ** (attempt - 1)
                logger.warning("%s; trying again in %g s", _one_line(error, 1), wait)
                time.sleep(wait)
                continue
            raise HubError(_one_line(error, attempt if _retriable(error) else 1)) from None
    raise AssertionError("unreachable")
