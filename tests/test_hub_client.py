"""Tests of modeling/hub_client.py: the timeouts every Hub request gets (pushes and loads: tests/test_hub.py,
tests/test_translation.py), the settings that change them, and which failures a Hub call retries."""

import json
import logging
import re
import socket
import time

import pytest
from helpers import (
    HUB_TOKEN,
    closed_port_endpoint,
    hub_cache_snapshot,
    push_translation_dataset,
    stalled_endpoint,
    synthetic_pairs,
)
from huggingface_hub import (
    CommitOperationAdd,
    HfApi,
    constants,
    get_session,
    set_client_factory,
    snapshot_download,
)
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import _http as hf_http
from huggingface_hub.utils._http import default_client_factory

from modeling import hub_client
from modeling.hub_client import (  # httpx2: httpx under huggingface_hub 1.x
    HUB_ATTEMPTS_ENV,
    HUB_TIMEOUT_ENV,
    MODEL_REPO_FILES,
    HubError,
    cached_commit,
    cached_snapshot,
    current_commit,
    httpx2,
    hub_attempts,
    hub_call,
    hub_timeout,
    looks_like_local_path,
    offline_cache_error,
    pinned_commit,
    use_hub_timeouts,
)

USER_HEADER = {"x-proxy-ticket": "from the user's own factory"}


def test_timeouts_keep_the_users_client_factory(quick_hub):
    """A user's `set_client_factory` (proxies, certificates) stays in force: its clients gain the bound, once
    however often the library installs it, and a request that asks to wait forever is cut at 0.3 s."""
    made = []

    def users_factory() -> httpx2.Client:
        made.append(httpx2.Client(headers=USER_HEADER, timeout=None))
        return made[-1]

    set_client_factory(users_factory)
    use_hub_timeouts()
    use_hub_timeouts()  # train() and a load by name each install it
    session = get_session()
    assert made == [session] and session.headers["x-proxy-ticket"] == USER_HEADER["x-proxy-ticket"]
    assert len(session.event_hooks["request"]) == 1
    with stalled_endpoint() as endpoint:
        start = time.monotonic()
        with pytest.raises(httpx2.TimeoutException):
            session.get(endpoint, timeout=None)
        assert time.monotonic() - start < 3


def test_without_a_factory_of_the_users_the_library_default_gets_the_bound(quick_hub):
    set_client_factory(default_client_factory)
    use_hub_timeouts()
    hooks = get_session().event_hooks["request"]
    assert len(hooks) == 2, "huggingface_hub's own request hook, then the bound"


def test_installing_the_bound_again_leaves_the_shared_client_and_its_transfers_open(quick_hub, monkeypatch):
    """Each load by name and each `train()` installed the factory again, which closes huggingface_hub's shared
    client: another thread's download under way on it failed (`ReadError: [Errno 9] Bad file descriptor`). A new
    bound (another VASWANI_HUB_TIMEOUT) still takes effect."""
    set_client_factory(default_client_factory)
    use_hub_timeouts()
    session = get_session()
    use_hub_timeouts()  # another thread loads a model by its Hub id
    assert get_session() is session and not session.is_closed
    monkeypatch.setenv(HUB_TIMEOUT_ENV, "0.5")
    use_hub_timeouts()
    assert get_session() is not session
    with stalled_endpoint() as endpoint:
        start = time.monotonic()
        with pytest.raises(httpx2.TimeoutException):
            get_session().get(endpoint, timeout=None)
        assert 0.4 < time.monotonic() - start < 3, "the new bound"


def test_pinning_a_revision_gives_up_on_a_missing_file_but_not_on_an_unreachable_hub(monkeypatch):
    """`pinned_commit` swallowed a failed connection too, and the load then waited for the Hub again through every
    retry before failing the same way: 55 s instead of 28 s with VASWANI_HUB_TIMEOUT=0.5 (8 retries), twice
    the wait with any timeout."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    from modeling import hub_client

    def unreachable(*args, **kwargs):
        try:
            raise httpx2.ConnectError("[Errno 111] Connection refused")
        except httpx2.ConnectError as error:  # huggingface_hub wraps it so, with nothing cached
            raise LocalEntryNotFoundError("cannot find the requested files in the local cache") from error

    monkeypatch.setattr(hub_client, "hf_hub_download", unreachable)
    with pytest.raises(HubError, match=r"^the Hub: cannot connect \(\[Errno 111\] Connection refused\)"):
        hub_client.pinned_commit("someorg/somemodel", None)

    def missing(*args, **kwargs):
        raise EntryNotFoundError("404 Client Error: config.json")

    monkeypatch.setattr(hub_client, "hf_hub_download", missing)
    assert hub_client.pinned_commit("someorg/somemodel", "v1") == "v1", "the load names the missing file itself"


@pytest.mark.parametrize(
    ("name", "text", "read", "message"),
    [
        (HUB_TIMEOUT_ENV, "0", hub_timeout, "VASWANI_HUB_TIMEOUT must be a positive, finite float, got '0'."),
        (
            HUB_TIMEOUT_ENV,
            "a minute",
            hub_timeout,
            "VASWANI_HUB_TIMEOUT must be a positive, finite float, got 'a minute'.",
        ),
        (HUB_TIMEOUT_ENV, "nan", hub_timeout, "VASWANI_HUB_TIMEOUT must be a positive, finite float, got 'nan'."),
        (HUB_TIMEOUT_ENV, "inf", hub_timeout, "VASWANI_HUB_TIMEOUT must be a positive, finite float, got 'inf'."),
        (HUB_ATTEMPTS_ENV, "1.5", hub_attempts, "VASWANI_HUB_ATTEMPTS must be a positive int, got '1.5'."),
        (HUB_ATTEMPTS_ENV, "-2", hub_attempts, "VASWANI_HUB_ATTEMPTS must be a positive int, got '-2'."),
    ],
)
def test_a_timeout_or_attempts_setting_that_is_no_positive_number_is_refused_naming_it(
    name, text, read, message, monkeypatch
):
    monkeypatch.setenv(name, text)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        read()


def _failing(*errors: BaseException):
    """A Hub call that raises `errors` in turn, then answers "done"; `calls` counts its calls."""

    def call() -> str:
        call.calls += 1
        if call.calls <= len(errors):
            raise errors[call.calls - 1]
        return "done"

    call.calls = 0
    return call


COMMIT = httpx2.Request("POST", "http://hub.test/api/models/me/model/commit/main")


def _answer(status: int, server_message: str | None = None) -> HfHubHTTPError:
    return HfHubHTTPError("refused", response=httpx2.Response(status, request=COMMIT), server_message=server_message)


@pytest.mark.parametrize("status", [500, 429, 408])
def test_a_hub_call_is_retried_after_a_server_error_a_timeout_or_too_many_requests(status, monkeypatch, caplog):
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "3")
    waits = []
    monkeypatch.setattr(hub_client.time, "sleep", waits.append)
    call = _failing(_answer(status), _answer(status))
    with caplog.at_level(logging.WARNING, logger="modeling.hub_client"):
        assert hub_call(call) == "done"
    assert call.calls == 3 and waits == [1.0, 2.0]
    reason = {500: "Internal Server Error", 429: "Too Many Requests", 408: "Request Timeout"}[status]
    assert f"POST {COMMIT.url}: HTTP {status} {reason}; trying again in 1 s\n" in caplog.text

    call = _failing(*[_answer(status)] * 3)
    with pytest.raises(HubError, match=rf"^POST {re.escape(str(COMMIT.url))}: HTTP {status} .*\(3 attempts\)$"):
        hub_call(call)
    assert call.calls == 3


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            _answer(404, "Repository Not Found for url: x.\nPlease make sure you specified the correct `repo_id`."),
            "HTTP 404 Not Found: Repository Not Found for url: x.",
        ),
        (_answer(401), "HTTP 401 Unauthorized (check the token: HF_TOKEN or `hf auth login`)"),
        (_answer(403), "HTTP 403 Forbidden (check the token: HF_TOKEN or `hf auth login`)"),
        (
            httpx2.TooManyRedirects("Exceeded maximum allowed redirects.", request=COMMIT),
            "Exceeded maximum allowed redirects.",
        ),
    ],
)
def test_a_hub_call_refused_for_another_reason_fails_at_once_in_one_line(error, message, monkeypatch):
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "3")
    monkeypatch.setattr(hub_client.time, "sleep", lambda seconds: pytest.fail("waited to try again"))
    call = _failing(error)
    with pytest.raises(HubError, match=f"^POST {re.escape(str(COMMIT.url))}: {re.escape(message)}$"):
        hub_call(call)
    assert call.calls == 1


def test_a_failure_that_names_no_request_is_said_of_the_hub(monkeypatch):
    """httpx raises some errors with no request attached (its `.request` then raises): the line still reads."""
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "1")
    with pytest.raises(HubError, match=r"^the Hub: cannot connect \(\[Errno 111\] Connection refused\)$"):
        hub_call(_failing(httpx2.ConnectError("[Errno 111] Connection refused")))


def test_a_transport_failure_without_a_message_is_named_by_its_kind(monkeypatch):
    """httpx raises some (a connection the server dropped: `ReadError`) with an empty message: "()" said nothing."""
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "1")
    with pytest.raises(HubError, match=rf"^POST {re.escape(str(COMMIT.url))}: cannot connect \(ReadError\)$"):
        hub_call(_failing(httpx2.ReadError("", request=COMMIT)))


def test_the_commit_of_a_revision_is_asked_of_the_hub_else_read_from_the_hub_cache(
    hub_here, quick_hub, monkeypatch, caplog
):
    """What `pinned_dataset_commit` builds on: the Hub's answer; the revision as given where the Hub does not know
    the repo; None where it cannot be asked, and then the commit the Hub cache recorded for the revision."""
    commit = push_translation_dataset(hub_here[0], "tester/pinned", {"test": synthetic_pairs(2)})
    assert current_commit("tester/pinned", None, repo_type="dataset") == commit
    assert current_commit("tester/absent", "v1", repo_type="dataset") == "v1"
    assert current_commit("tester/pinned", "no-such-branch", repo_type="dataset") == "no-such-branch", "not main's"
    assert cached_commit("tester/pinned", None, repo_type="dataset") is None  # nothing downloaded yet
    snapshot_download("tester/pinned", repo_type="dataset")
    with socket.socket() as closed:  # a port that refuses connections
        closed.bind(("127.0.0.1", 0))
        quick_hub(f"http://127.0.0.1:{closed.getsockname()[1]}")
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    with caplog.at_level(logging.WARNING, logger="modeling.hub_client"):
        assert current_commit("tester/pinned", None, repo_type="dataset") is None
    assert "The Hub cannot be asked for tester/pinned (GET http://127.0.0.1:" in caplog.text
    assert cached_commit("tester/pinned", None, repo_type="dataset") == commit
    assert cached_snapshot("tester/pinned", None, repo_type="dataset").name == commit
    assert current_commit("tester/pinned", commit, repo_type="dataset") == commit  # a commit: nothing to ask


def test_a_setting_left_unset_or_empty_takes_its_default(monkeypatch):
    monkeypatch.delenv(HUB_TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "")  # `VAR= python train.py`: unset, not refused
    assert hub_timeout() == 60.0 and hub_attempts() == 3


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("owner/model", False),
        ("model", False),
        ("./model", True),
        ("../runs/model", True),
        ("~/model", True),
        ("/model", True),  # a container's mount
        ("runs/en-de/model", True),  # no Hub id has two slashes
        ("runs\\model", True),  # a Windows path
    ],
)
def test_a_name_that_cannot_be_a_hub_repo_id_is_taken_as_a_local_path(name, local):
    assert looks_like_local_path(name) is local


def test_pinning_a_revision_offline_keeps_it_as_given_without_asking(monkeypatch):
    """Offline, the revision asked for (a branch, a tag) is what the load reads from the cache; None stays main's."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_client, "hf_hub_download", lambda *args, **kwargs: pytest.fail("asked the Hub"))
    assert pinned_commit("someorg/somemodel", "v1") == "v1"
    assert pinned_commit("someorg/somemodel", None) is None


def test_offline_the_commit_of_a_revision_is_not_asked_of_the_hub(monkeypatch, caplog):
    """None (read the Hub cache's record), quietly: offline is no failure to warn of; a commit is its own."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_client, "HfApi", lambda *args, **kwargs: pytest.fail("asked the Hub"))
    with caplog.at_level(logging.WARNING, logger="modeling.hub_client"):
        assert current_commit("tester/pinned", None, repo_type="dataset") is None
        assert current_commit("tester/pinned", "c" * 40, repo_type="dataset") == "c" * 40
    assert caplog.text == ""


def test_offline_a_sharded_model_in_the_cache_counts_only_with_all_its_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.dumps({"metadata": {}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}})
    files = {"config.json": "{}", "model.safetensors.index.json": index, "tokenizer.json": "{}"}
    snapshot = hub_cache_snapshot(tmp_path, "owner/sharded", "a" * 40, {**files, **dict.fromkeys(shards, "")})
    assert offline_cache_error("owner/sharded", None, MODEL_REPO_FILES) is None
    (snapshot / shards[1]).unlink()
    assert str(offline_cache_error("owner/sharded", None, MODEL_REPO_FILES)) == (
        f"The Hub cache {tmp_path} holds 'owner/sharded' without model.safetensors or model.safetensors.index.json, "
        "and offline mode (HF_HUB_OFFLINE) keeps it from the Hub: download it where the Hub can be reached, into the "
        "same HF_HOME (hf download owner/sharded)"
    )


def test_offline_a_model_cached_at_other_revisions_only_is_named_with_them(tmp_path, monkeypatch):
    """`hf download --revision` leaves no main: the error names the revisions there, and how to name one."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    files = {"config.json": "{}", "model.safetensors": "", "tokenizer.json": "{}"}
    for commit in ("b" * 40, "a" * 40):
        hub_cache_snapshot(tmp_path, "owner/pinned", commit, files, main=False)
    assert offline_cache_error("owner/pinned", "a" * 40, MODEL_REPO_FILES) is None
    assert str(offline_cache_error("owner/pinned", None, MODEL_REPO_FILES)) == (
        f"The Hub cache {tmp_path} holds 'owner/pinned' at the revisions {'a' * 40}, {'b' * 40} only, not its main, "
        "and offline mode (HF_HUB_OFFLINE) keeps it from the Hub: name one as the revision (--revision; train.py: "
        "--model_revision), or download it where the Hub can be reached, into the same HF_HOME (hf download "
        "owner/pinned)"
    )
    assert str(offline_cache_error("owner/pinned", "v2", MODEL_REPO_FILES)) == (
        f"'owner/pinned' at revision 'v2' is not in the Hub cache {tmp_path}, and offline mode (HF_HUB_OFFLINE) keeps "
        "it from the Hub: download it where the Hub can be reached, into the same HF_HOME (hf download owner/pinned "
        "--revision v2)"
    )


def test_offline_a_model_whose_snapshots_were_all_removed_is_named_as_not_in_the_cache(tmp_path, monkeypatch):
    """Its snapshots emptied by hand (to free the space), a repo's folder names no revision the cache holds."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    (tmp_path / "models--owner--emptied" / "snapshots").mkdir(parents=True)
    assert str(offline_cache_error("owner/emptied", None, MODEL_REPO_FILES)) == (
        f"'owner/emptied' is not in the Hub cache {tmp_path}, and offline mode (HF_HUB_OFFLINE) keeps it from the "
        "Hub: download it where the Hub can be reached, into the same HF_HOME (hf download owner/emptied)"
    )


def test_the_hub_cache_gives_the_commit_of_the_revision_asked_for_not_mains(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    hub_cache_snapshot(tmp_path, "owner/tagged", "a" * 40, {"config.json": "{}"})
    (tmp_path / "models--owner--tagged" / "refs" / "v1").write_text("b" * 40)  # `hf download --revision v1`
    assert cached_commit("owner/tagged", None, repo_type="model") == "a" * 40
    assert cached_commit("owner/tagged", "v1", repo_type="model") == "b" * 40


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            httpx2.ReadTimeout("timed out", request=COMMIT),
            "no answer within 0.3 s (2 attempts); a slow network may need a larger VASWANI_HUB_TIMEOUT (seconds)",
        ),
        (
            httpx2.ConnectError("[Errno 111] Connection refused", request=COMMIT),
            "cannot connect ([Errno 111] Connection refused) (2 attempts)",
        ),
    ],
)
def test_a_hub_call_that_times_out_or_cannot_connect_is_retried_then_says_which(
    error, message, quick_hub, monkeypatch
):
    """A timeout names the limit and the setting that raises it, not "cannot connect": the network is slow, not
    down."""
    waits = []
    monkeypatch.setattr(hub_client.time, "sleep", waits.append)
    call = _failing(error, error)
    with pytest.raises(HubError, match=f"^POST {re.escape(str(COMMIT.url))}: {re.escape(message)}$"):
        hub_call(call)
    assert call.calls == 2 and waits == [0.1]


def test_the_bound_keeps_a_shorter_limit_a_request_asks_for_and_connects_within_10_s(monkeypatch):
    """Each limit is the smaller of the request's and ours; connecting takes at most 10 s of the 60 (a host that
    does not answer is down, not slow), or all of a bound shorter than that."""
    monkeypatch.delenv(HUB_TIMEOUT_ENV, raising=False)
    client = hub_client._bounding_timeouts(httpx2.Client(), hub_timeout())
    request = client.build_request("GET", "http://hub.test/api/models/me/model", timeout=httpx2.Timeout(None, read=5))
    client.event_hooks["request"][-1](request)
    assert request.extensions["timeout"] == {"connect": 10.0, "read": 5.0, "write": 60.0, "pool": 60.0}
    client = hub_client._bounding_timeouts(httpx2.Client(), 0.3)
    request = client.build_request("GET", "http://hub.test/api/models/me/model", timeout=None)
    client.event_hooks["request"][-1](request)
    assert request.extensions["timeout"] == dict.fromkeys(("connect", "read", "write", "pool"), 0.3)


def test_a_failed_connection_behind_a_load_error_is_named_in_one_line_and_other_errors_pass(monkeypatch):
    """transformers wraps a refused connection in an OSError that says neither; the cause may hang on the error
    as its `__cause__` or, raised while handling it, as its `__context__`. An OSError with no failed connection
    behind it (a missing file) passes unchanged."""

    def refused_load():
        try:
            try:
                raise httpx2.ConnectError("[Errno 111] Connection refused")
            except httpx2.ConnectError:
                raise RuntimeError("huggingface_hub gave up")  # noqa: B904 - chained implicitly, as some code does
        except RuntimeError as error:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files") from error

    with pytest.raises(HubError) as raised, hub_client.naming_hub_failures("Could not load 'owner/model'"):
        refused_load()
    assert str(raised.value) == (
        "Could not load 'owner/model': the Hub: cannot connect ([Errno 111] Connection refused) (without internet, "
        "set HF_HUB_OFFLINE=1 to load from the cache)"
    )
    missing = FileNotFoundError("owner/model does not appear to have a file named config.json")
    with pytest.raises(FileNotFoundError) as raised, hub_client.naming_hub_failures("Could not load 'owner/model'"):
        raise missing
    assert raised.value is missing


def test_a_tokenizer_is_either_of_its_files(tmp_path):
    """A tokenizer saved as tokenizer_config.json alone (a slow tokenizer's) counts, as does tokenizer.json alone."""
    assert not hub_client.holds_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert hub_client.holds_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer.json").write_text("{}")
    assert hub_client.holds_tokenizer(tmp_path)


def test_offline_a_commit_cached_without_a_file_is_named_as_held_without_it(tmp_path, monkeypatch):
    """A commit whose snapshot is in the cache is "held without" the missing file, not "not in the Hub cache";
    a commit the cache has no snapshot of is not its own record there."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    files = {"config.json": "{}", "model.safetensors": ""}
    hub_cache_snapshot(tmp_path, "owner/pinned", "a" * 40, files, main=False)
    assert cached_commit("owner/pinned", "a" * 40, repo_type="model") == "a" * 40
    assert cached_commit("owner/pinned", "b" * 40, repo_type="model") is None
    assert str(offline_cache_error("owner/pinned", "a" * 40, MODEL_REPO_FILES)) == (
        f"The Hub cache {tmp_path} holds 'owner/pinned' at revision '{'a' * 40}' without tokenizer.json or "
        "tokenizer_config.json, and offline mode (HF_HUB_OFFLINE) keeps it from the Hub: download it where the Hub "
        f"can be reached, into the same HF_HOME (hf download owner/pinned --revision {'a' * 40})"
    )


def _push_model_commits(endpoint: str, repo_id: str, *commits: dict[str, str]) -> list[str]:
    """Push each {name: text} in turn to the loopback Hub's model `repo_id` (created); the commits' shas."""
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo(repo_id, exist_ok=True)
    return [
        api.create_commit(
            repo_id, [CommitOperationAdd(name, text.encode()) for name, text in files.items()], commit_message="m"
        ).oid
        for files in commits
    ]


def test_pinning_and_looking_for_a_file_read_the_revision_asked_for_not_mains(hub_here):
    """A load pinned to an older commit reads that commit's files; whether it holds a tokenizer is asked of it
    too, not of main, which may have gained one since."""
    first, second = _push_model_commits(
        hub_here[0],
        "tester/revisions",
        {"config.json": "{}"},
        {"config.json": '{"d_model": 8}', "tokenizer.json": "{}"},
    )
    assert pinned_commit("tester/revisions", first) == first
    assert pinned_commit("tester/revisions", None) == second
    assert not hub_client.has_any_file("tester/revisions", first, hub_client.TOKENIZER_FILES)
    assert hub_client.has_any_file("tester/revisions", None, hub_client.TOKENIZER_FILES)


def test_offline_a_file_not_in_the_cache_is_missing_without_asking_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub_client, "file_exists", lambda *args, **kwargs: pytest.fail("asked the Hub"))
    hub_cache_snapshot(tmp_path, "owner/model", "a" * 40, {"config.json": "{}", "tokenizer.json": "{}"})
    assert not hub_client.has_any_file("owner/model", None, ("tokenizer_config.json",))
    assert hub_client.has_any_file("owner/model", None, hub_client.TOKENIZER_FILES)


def test_a_load_from_the_cache_of_a_hub_that_cannot_be_reached_names_the_commit_it_is_at(hub_here, quick_hub, caplog):
    """The cache holding main at an earlier commit (read before the last push), the Hub unreachable without
    HF_HUB_OFFLINE: huggingface_hub answered with the cache's config.json without a word, so the load, and the
    evaluation record, went on at the earlier commit as if it were the repo's main."""
    repo_id = "tester/unreachable-later"
    endpoint = hub_here[0]
    (first,) = _push_model_commits(endpoint, repo_id, {"config.json": "{}"})
    assert pinned_commit(repo_id, None) == first
    (second,) = _push_model_commits(endpoint, repo_id, {"config.json": '{"d_model": 8}'})

    quick_hub(closed_port_endpoint())
    with caplog.at_level(logging.WARNING, logger="modeling.hub_client"):
        assert pinned_commit(repo_id, None) == first
    assert re.fullmatch(
        rf"The Hub cannot be reached \(HEAD .+/{repo_id}/resolve/main/config\.json: cannot connect .+\): "
        rf"'{repo_id}' loads from the cache, at the commit {first} that main was at when it was last read, which a "
        r"later push may have left behind \(set HF_HUB_OFFLINE=1 to load from the cache without asking\)",
        caplog.records[-1].getMessage(),
    )
    with pytest.raises(HubError, match=r"cannot connect .+ \(without internet, set HF_HUB_OFFLINE=1"):
        pinned_commit("tester/never-read", None)
    quick_hub(endpoint)
    assert pinned_commit(repo_id, None) == second
