"""ax_client against a real ax: apply, keyed triggers, records, results across a NATS restart,
claims and tokens."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import ax_client

NOOP = """\
version: v1
job:
  name: py_noop
  exec: { type: noop }
"""

def test_an_instance_bucket_is_the_nodes_hash_of_the_job():
    """The same numbers as the Rust test of ``instance_buckets::index_of``."""
    from ax_client._client import _bucket_of

    assert _bucket_of("a.x", 65535) == 0xE40C292C % 65535  # FNV-1a 32 of "a"
    assert [_bucket_of(f"{job}.x", 7) for job in ["nightly-etl", "py_echo", "report-7", "orders"]] == [4, 5, 1, 3]
    assert _bucket_of("anything.at-all", 1) == 0


ECHO = """\
version: v1
job:
  name: py_echo
  exec: { type: shell, command: 'printf "{\\"order\\": \\"%s\\"}" "$AX_PARAM_order" > "$AX_OUTPUT_FILE"' }
"""


async def test_apply_then_a_key_sent_twice_makes_one_instance(cluster):
    client = await ax_client.connect(cluster.url)
    async with client:
        changes = await client.apply(NOOP)
        assert changes in ([{"name": "py_noop", "change": "created"}], [{"name": "py_noop", "change": "unchanged"}])
        first = await client.trigger("py_noop", key="order-42", params={"order": 42})
        again = await client.trigger("py_noop", key="order-42")
        assert first.instance_id == again.instance_id == "py_noop.key-order-42"
        assert first.trace_id == again.trace_id
        done = await client.wait(first.instance_id, timeout=60)
        assert (done.state, done.attempt) == ("success", 1)
        assert done.expected_time is not None and done.expected_time.tzinfo is not None
        assert done.raw["params"]["order"] == 42


async def test_an_attempts_log_is_read_in_order_with_its_end(cluster):
    async with await ax_client.connect(cluster.url) as client:
        await client.apply(
            {
                "name": "py_talk",
                "exec": {"type": "shell", "command": "echo one; echo two >&2; echo three"},
            }
        )
        done = await client.wait((await client.trigger("py_talk")).instance_id, timeout=60)
        assert done.state == "success"
        deadline = asyncio.get_running_loop().time() + 30
        log = await client.logs(done.instance_id)
        while not log.complete and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            log = await client.logs(done.instance_id)
        assert log.complete and log.attempt == 1
        assert (log.stdout, log.stderr, log.left_out) == ("one\nthree\n", "two\n", 0)
        empty = await client.logs(done.instance_id, attempt=2)
        assert (empty.pieces, empty.complete) == ([], False)


async def test_a_refused_command_names_the_line_and_changes_nothing(cluster):
    async with await ax_client.connect(cluster.url) as client:
        bad = NOOP.replace("py_noop", "py_bad").replace("exec:", "cron: '0 61 * * *'\n  exec:")
        with pytest.raises(ax_client.CommandRefused) as refused:
            await client.apply(bad)
        assert any("job.cron" in e for e in refused.value.errors), refused.value.errors
        with pytest.raises(ax_client.CommandRefused) as refused:
            await client.trigger("py_missing")
        assert "py_missing" in str(refused.value)
        assert await client.get_instance("py_bad.none") is None


async def test_a_dict_spec_and_a_delayed_trigger(cluster):
    async with await ax_client.connect(cluster.url) as client:
        await client.apply({"name": "py_later", "exec": {"type": "noop"}})
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
        later = await client.trigger("py_later", at=at, key="reminder-1")
        assert (later.state, later.tag) == ("running", "scheduled")
        with pytest.raises(TimeoutError):
            await client.wait(later.instance_id, timeout=0.3)
        soon = await client.trigger("py_later", delay=dt.timedelta(milliseconds=300))
        assert (await client.wait(soon.instance_id, timeout=60)).state == "success"


async def test_results_come_through_a_durable_consumer_across_a_nats_restart(cluster):
    async with await ax_client.connect(cluster.url) as client:
        await client.apply(ECHO)
        results = client.results(job="py_echo", durable="py-restart", from_start=True)
        reading = asyncio.ensure_future(results.__anext__())
        first = await client.trigger("py_echo", key="r1", params={"order": "r1"})
        got = await asyncio.wait_for(reading, timeout=60)
        assert (got.instance_id, got.state, got.output) == (first.instance_id, "success", {"order": "r1"})

        cluster.restart_nats()

        second = None
        for _ in range(600):
            try:
                second = await client.trigger("py_echo", key="r2", params={"order": "r2"}, timeout=2)
                break
            except ax_client.AxError:
                await asyncio.sleep(0.1)  # Reconnecting: the command is sent again (keyed).
        assert second is not None, cluster.log()
        got = await asyncio.wait_for(results.__anext__(), timeout=120)
        assert (got.instance_id, got.output) == (second.instance_id, {"order": "r2"})
        await results.aclose()


async def test_a_trace_id_is_claimed_once(cluster):
    async with await ax_client.connect(cluster.url) as one, await ax_client.connect(cluster.url) as two:
        assert await one.claim("trace-py-1", owner="billing") is True
        assert await two.claim("trace-py-1", owner="billing") is False
        assert await one.claim("trace-py-1") is False
        assert await two.claim("trace-py-2") is True


async def test_commands_need_a_token_when_auth_is_on(secured):
    async with await ax_client.connect(secured.url) as anonymous:
        with pytest.raises(ax_client.CommandRefused) as refused:
            await anonymous.apply(NOOP)
        assert refused.value.denied
    async with await ax_client.connect(secured.url, token=secured.admin_token()) as admin:
        assert await admin.apply(NOOP) == [{"name": "py_noop", "change": "created"}]
        instance = await admin.trigger("py_noop")
        assert (await admin.wait(instance.instance_id)).state == "success"


class Accepting:
    """An endpoint answering every POST with 202 Accepted, keeping the trace ids it was sent."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        traces = self.traces = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                traces.append(body["traceId"])
                answer = b'{"accepted": true}'
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/work"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    async def trace(self, n: int) -> str:
        for _ in range(600):
            if len(self.traces) >= n:
                return self.traces[n - 1]
            await asyncio.sleep(0.1)
        raise AssertionError(f"the endpoint got {len(self.traces)} requests, not {n}")


async def test_an_accepted_http_job_ends_with_its_first_report(cluster):
    endpoint = Accepting()
    async with await ax_client.connect(cluster.url) as client:
        await client.apply({"name": "py_accepts", "timeout": 300, "exec": {"type": "http", "url": endpoint.url}})
        await client.apply({"name": "py_forgets", "timeout": 1, "exec": {"type": "http", "url": endpoint.url}})
        instance = await client.trigger("py_accepts")
        trace = await endpoint.trace(1)
        assert trace == instance.trace_id
        assert await client.report(trace, True, "loaded", output={"rows": 3}) is True
        done = await client.wait(instance.instance_id)
        assert (done.state, done.message, done.output) == ("success", "loaded", {"rows": 3})
        assert await client.report(trace, False, "again") is False  # ignored
        assert (await client.get_instance(instance.instance_id)).state == "success"

        forgotten = await client.trigger("py_forgets")
        stale = await endpoint.trace(2)
        ended = await client.wait(forgotten.instance_id)
        assert (ended.state, ended.tag) == ("failed", "timeout")
        with pytest.raises(ax_client.ReportRefused) as refused:
            await client.report(stale, True, "too late")
        assert "stale trace id" in str(refused.value)
        endpoint.server.shutdown()


async def test_a_client_of_one_namespace_triggers_and_reads_only_its_own(cluster):
    """``connect(namespace=...)``: short names are the namespace's jobs, records come through
    the Schedulers' ``instance`` on the namespace's subject, which find no other namespace's."""
    async with await ax_client.connect(cluster.url) as admin:
        await admin.apply(
            [
                {"namespace": "py-team", "name": "hello", "exec": {"type": "noop"}},
                {"namespace": "py-other", "name": "hidden", "exec": {"type": "noop"}},
            ]
        )
        hidden = await admin.trigger("py-other/hidden")
    async with await ax_client.connect(cluster.url, namespace="py-team") as team:
        assert team.namespace == "py-team"
        results = team.results("hello", durable="py-team-1", from_start=True)
        instance = await team.trigger("hello")
        assert instance.instance_id.startswith("py-team.hello.")
        assert instance.job == "py-team.hello"
        done = await team.wait(instance.instance_id, timeout=60)
        assert (done.state, done.job) == ("success", "py-team.hello")
        result = await asyncio.wait_for(results.__anext__(), timeout=30)
        assert (result.instance_id, result.state) == (instance.instance_id, "success")
        # Another namespace's job cannot be triggered, nor its instance read, from here.
        with pytest.raises(ax_client.CommandRefused, match="not in namespace `py-team`"):
            await team.trigger("py-other/hidden")
        assert await team.get_instance(hidden.instance_id) is None
    with pytest.raises(ax_client.AxError, match="is not a namespace"):
        await ax_client.connect(cluster.url, namespace="No Such")
