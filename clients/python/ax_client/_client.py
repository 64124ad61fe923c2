"""The client: one NATS connection, the control commands, the buckets and the results stream.

Commands go the durable way (docs/protocol.md): published with JetStream on
``ax.control.<command>`` with ``Ax-Reply-To`` naming an inbox, so a command sent while no
Scheduler runs waits in the stream; the answer comes back on the inbox. Records are read from
the ``ax_instances`` bucket (or, in a deployment that keeps them in several buckets, the one
the job's name hashes to), results from a durable pull consumer of ``AX_RESULTS``.

A client of one namespace (``connect(namespace=...)``), as a team's services connect with the
NATS user ``ax namespace user`` prints, sends ``trigger``, ``report`` and ``instance`` on the
namespace's own subjects (``ax.control.trigger.<namespace>``), where a job named without a
namespace is one of its own, and reads records through the Schedulers (``instance``): that
user may read no bucket.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import re
import urllib.parse
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

import msgpack
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import api

from ._types import (
    AxError,
    CommandRefused,
    Instance,
    Log,
    Reply,
    ReportRefused,
    Result,
    format_time,
)

JobSpec = Union[str, Mapping[str, Any], Sequence[Mapping[str, Any]]]

#: How long a command waits for its answer by default.
COMMAND_TIMEOUT = 10.0


#: The commands a namespace's services send on the namespace's own subjects.
_IN_NAMESPACE = frozenset({"trigger", "report", "instance"})

#: The key, in the partitions bucket, of the number of instance buckets.
_BUCKETS_KEY = "instance_buckets"


def _bucket_of(instance_id: str, count: int) -> int:
    """The instance bucket of a record: FNV-1a 32 of its id's first token (its job's name)
    modulo the count, as the nodes compute it."""
    digest = 0x811C9DC5
    for byte in instance_id.split(".", 1)[0].encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return digest % count


def _decode(headers: Optional[Mapping[str, str]], payload: bytes) -> Any:
    """A payload by its Content-Type (JSON when it says so, MessagePack otherwise)."""
    content_type = (headers or {}).get("Content-Type", "")
    if content_type.split(";")[0].strip().lower() == "application/json":
        return json.loads(payload)
    return msgpack.unpackb(payload, raw=False)


def _delay(delay: Union[str, _dt.timedelta, float, int]) -> str:
    """A delay as ax reads it (``250ms``, ``30s``...): a timedelta or seconds become ms."""
    if isinstance(delay, str):
        return delay
    seconds = delay.total_seconds() if isinstance(delay, _dt.timedelta) else float(delay)
    return f"{max(1, round(seconds * 1000))}ms"


def _documents(spec: JobSpec) -> Dict[str, Any]:
    """An apply request: YAML text as it is, a job (or its document) or a list of them."""
    if isinstance(spec, str):
        return {"yaml": spec}
    docs = [spec] if isinstance(spec, Mapping) else list(spec)
    return {
        "jobs": [
            dict(doc) if "job" in doc else {"version": "v1", "job": dict(doc)} for doc in docs
        ]
    }


class Client:
    """A connection to ax. Make one with :func:`connect`; close it with :meth:`close`."""

    def __init__(
        self, nc: NATS, token: Optional[str], prefix: str, namespace: Optional[str] = None
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._token = token
        self._prefix = prefix
        self._namespace = namespace
        self._tag = prefix.replace(".", "_")
        self._buckets: Dict[str, Any] = {}
        self._bucket_count: Optional[int] = None

    @property
    def namespace(self) -> Optional[str]:
        """The namespace this client acts in, if one."""
        return self._namespace

    def _job(self, job: str) -> str:
        """``job`` as ax names it: ``team/x`` is ``team.x``; in a client of one namespace a
        name without one is the namespace's."""
        if "/" in job:
            namespace, name = job.split("/", 1)
            return name if namespace == "default" else f"{namespace}.{name}"
        if self._namespace and "." not in job:
            return f"{self._namespace}.{job}"
        return job

    @property
    def nats(self) -> NATS:
        """The NATS connection underneath."""
        return self._nc

    async def close(self) -> None:
        """Drains and closes the connection."""
        await self._nc.drain()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # Commands.

    async def command(
        self, command: str, request: Mapping[str, Any], timeout: float = COMMAND_TIMEOUT
    ) -> Reply:
        """Sends control command ``command`` and returns its answer.

        Raises :class:`CommandRefused` when ax refused it (nothing changed) and :class:`AxError`
        when no answer came in ``timeout`` seconds (the command stays queued and is carried
        out when a Scheduler takes it: read the outcome before sending it again).
        """
        inbox = self._nc.new_inbox()
        answers = await self._nc.subscribe(inbox, max_msgs=1)
        headers = {
            "Content-Type": "application/msgpack",
            "Ax-Reply-To": inbox,
            "Ax-Via": "api",
        }
        if self._token:
            headers["Ax-Token"] = self._token
        subject = f"{self._prefix}.control.{command}"
        if self._namespace and command in _IN_NAMESPACE:
            subject = f"{subject}.{self._namespace}"
        try:
            ack = await self._js.publish(
                subject, msgpack.packb(dict(request)), headers=headers, timeout=timeout
            )
            try:
                answer = await answers.next_msg(timeout=timeout)
            except nats.errors.TimeoutError:
                raise AxError(
                    f"no answer to {command} within {timeout}s: it is queued (stream sequence "
                    f"{ack.seq}) and will be carried out when a Scheduler takes it"
                ) from None
        except nats.errors.Error as e:
            raise AxError(f"{command} not sent: {e}") from e
        finally:
            try:
                await answers.unsubscribe()
            except nats.errors.Error:
                pass
        reply = Reply.of(_decode(answer.headers, answer.data))
        if not reply.ok:
            denied = bool(reply.raw.get("denied"))
            refused = ReportRefused if command == "report" and not denied else CommandRefused
            raise refused(command, reply.errors, denied)
        return reply

    async def apply(self, spec: JobSpec, timeout: float = COMMAND_TIMEOUT) -> List[Dict[str, str]]:
        """Creates or updates jobs, all or nothing; returns ``[{name, change}]``.

        ``spec`` is job files' text (YAML, one job per document), one job as a dict (the
        ``job:`` part, or the whole document with ``version``), or a list of them.
        """
        return (await self.command("apply", _documents(spec), timeout)).changes

    async def trigger(
        self,
        job: str,
        params: Optional[Mapping[str, Any]] = None,
        biz_date: Optional[str] = None,
        at: Optional[Union[str, _dt.datetime]] = None,
        delay: Optional[Union[str, _dt.timedelta, float, int]] = None,
        key: Optional[str] = None,
        timeout: float = COMMAND_TIMEOUT,
    ) -> Instance:
        """Starts one instance of ``job`` and returns its record.

        With ``key`` the instance is ``<job>.key-<key>``, created once however often the same
        trigger is sent (the second returns the first's instance). ``at`` (an aware datetime or
        RFC 3339 text) or ``delay`` (``"30s"``, a timedelta or seconds) schedule it for later.
        """
        request: Dict[str, Any] = {"name": job, "params": dict(params or {})}
        if biz_date is not None:
            request["biz_date"] = biz_date
        if key is not None:
            request["key"] = key
        if at is not None:
            request["at"] = format_time(at) if isinstance(at, _dt.datetime) else at
        if delay is not None:
            request["in"] = _delay(delay)
        reply = await self.command("trigger", request, timeout)
        if not reply.instance_id:
            raise AxError(f"trigger of {job} answered without an instance: {reply.message}")
        instance = await self.get_instance(reply.instance_id)
        if instance is None:
            raise AxError(f"instance {reply.instance_id} is not in the instances bucket")
        return instance

    # Records.

    async def _bucket(self, what: str) -> Any:
        if what not in self._buckets:
            self._buckets[what] = await self._js.key_value(f"{self._tag}_{what}")
        return self._buckets[what]

    async def _instance_buckets(self) -> int:
        """The number of instance buckets, read once (``instance_buckets`` in the partitions
        bucket; none stored: one). A move to another count happens while no node runs, and
        a client connected before it reconnects after."""
        if self._bucket_count is None:
            partitions = await self._bucket("partitions")
            try:
                entry = await partitions.get(_BUCKETS_KEY)
                count = int((entry.value or b"1").decode())
            except nats.js.errors.KeyNotFoundError:
                count = 1
            except ValueError as e:
                raise AxError(f"the partitions bucket's `{_BUCKETS_KEY}` is not a count: {e}")
            self._bucket_count = max(count, 1)
        return self._bucket_count

    async def get_instance(self, instance_id: str) -> Optional[Instance]:
        """The record of ``instance_id``, or None when there is none (in a client of one
        namespace: none of that namespace's)."""
        if self._namespace:
            try:
                reply = await self.command("instance", {"instance": instance_id})
            except CommandRefused as refused:
                if any(e.startswith("unknown instance") for e in refused.errors):
                    return None
                raise
            record = reply.raw.get("record")
            if not isinstance(record, dict):
                raise AxError(f"the read of {instance_id} answered without a record")
            return Instance.of(record)
        index = _bucket_of(instance_id, await self._instance_buckets())
        bucket = await self._bucket("instances" if index == 0 else f"instances_{index}")
        try:
            entry = await bucket.get(instance_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        return Instance.of(msgpack.unpackb(entry.value, raw=False), entry.revision or 0)

    async def wait(self, instance_id: str, timeout: float = 60.0, poll: float = 0.1) -> Instance:
        """The record of ``instance_id`` once it is final (success, failed or cancelled).

        Raises TimeoutError when it is not final within ``timeout`` seconds. A NATS outage
        meanwhile only delays the answer: the record is read again once the client is back. A
        client of one namespace reads through the Schedulers (a command each time), so it reads
        at most twice a second.
        """
        if self._namespace:
            poll = max(poll, 0.5)
        deadline = asyncio.get_running_loop().time() + timeout
        last: Optional[Instance] = None
        while True:
            try:
                last = await self.get_instance(instance_id)
            except (nats.errors.Error, asyncio.TimeoutError):
                pass
            if last is not None and last.is_final:
                return last
            if asyncio.get_running_loop().time() >= deadline:
                state = f"{last.state} ({last.tag})" if last else "no record"
                raise TimeoutError(f"{instance_id} is not final after {timeout}s: {state}")
            await asyncio.sleep(poll)

    async def logs(
        self, instance_id: str, attempt: Optional[int] = None, timeout: float = COMMAND_TIMEOUT
    ) -> Log:
        """Attempt ``attempt`` (the last one when None) of ``instance_id``'s log, as shipped so
        far: read whole from ``AX_LOGS``, each chunk once (a chunk sent again after a NATS
        outage is kept once). ``complete`` says whether its end arrived."""
        if attempt is None:
            record = await self.get_instance(instance_id)
            if record is None:
                raise AxError(f"no instance {instance_id}")
            attempt = record.attempt
        subject = f"{self._prefix}.log.{instance_id}.{attempt}"
        stream = f"{self._tag.upper()}_LOGS"
        chunks: Dict[int, Mapping[str, Any]] = {}
        # Read message by message with direct gets, each the next on the log's subject: no
        # consumer is made, so a service confined to consumers of its own names (the
        # permission table) reads logs too.
        seq = 1
        while True:
            try:
                message = await asyncio.wait_for(
                    self._js.get_msg(stream, seq=seq, subject=subject, direct=True, next=True),
                    timeout,
                )
            except nats.js.errors.NotFoundError:
                break
            if message.data is None or message.seq is None:
                raise AxError(f"{stream}: a direct get answered no message at {seq}")
            chunk = msgpack.unpackb(message.data, raw=False)
            chunks.setdefault(int(chunk["seq"]), chunk)
            seq = int(message.seq) + 1
        pieces = []
        end: Optional[Mapping[str, Any]] = None
        for seq in sorted(chunks):
            chunk = chunks[seq]
            for piece in chunk.get("pieces") or []:
                pieces.append((piece["stream"], bytes(piece["data"])))
            end = chunk.get("end") or end
        return Log(
            instance_id=instance_id,
            attempt=attempt,
            pieces=pieces,
            complete=end is not None,
            left_out=int((end or {}).get("left_out") or 0),
        )

    async def results(
        self,
        job: Optional[str] = None,
        durable: Optional[str] = None,
        from_start: bool = False,
        batch: int = 32,
    ) -> AsyncIterator[Result]:
        """Every result of ``job`` (every job when None), through durable consumer ``durable``.

        The consumer lives in JetStream: a service that stops and comes back (or whose NATS
        restarts) goes on where it stopped. A result is acknowledged when the loop asks for the
        next one, so one being handled when the process dies comes again: results are delivered
        at least once — deduplicate on ``(trace_id, attempt)``. A new consumer starts with the
        results published from then on, or with every result kept (7 days) with ``from_start``.
        Under the shipped NATS permissions a service's consumers are named after its user,
        ``<user>-1`` to ``<user>-8``: pass one as ``durable``. A client of one namespace reads
        that namespace's results (``job`` one of its jobs), through ``<namespace>-1`` unless
        ``durable`` names another.
        """
        if self._namespace:
            target = self._job(job) if job else f"{self._namespace}.>"
            subject = f"{self._prefix}.result.{target}"
            name = durable or f"{self._namespace}-1"
        else:
            subject = f"{self._prefix}.result.{job or '>'}"
            name = durable or f"py-{job or 'all'}"
        config = api.ConsumerConfig(
            durable_name=name,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL if from_start else api.DeliverPolicy.NEW,
            filter_subject=subject,
            ack_wait=30,
        )
        stream = f"{self._tag.upper()}_RESULTS"
        subscription = None
        while True:
            try:
                if subscription is None:
                    subscription = await self._js.pull_subscribe(
                        subject, durable=name, stream=stream, config=config
                    )
                messages = await subscription.fetch(batch, timeout=1)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                continue
            except nats.js.errors.NotFoundError:
                # The consumer is gone (a store lost with its server): made again.
                subscription = None
                await asyncio.sleep(0.5)
                continue
            except nats.errors.Error:
                # Disconnected: the client reconnects by itself; the consumer kept its place.
                await asyncio.sleep(0.2)
                continue
            for message in messages:
                yield Result.of(_decode(message.headers, message.data))
                try:
                    await message.ack()
                except nats.errors.Error:
                    pass  # Redelivered after ack_wait.

    # Business code.

    async def report(
        self,
        trace_id: str,
        success: bool,
        message: str = "",
        output: Any = None,
        timeout: float = COMMAND_TIMEOUT,
    ) -> bool:
        """Reports how the work of attempt ``trace_id`` ended, for an http job whose endpoint
        answered ``202 Accepted`` (the trace id is the request's ``Ax-Trace-Id`` header and its
        body's ``traceId``). Report after your transaction commits.

        True when the report was taken (the attempt ends with it); False when a report of this
        trace was taken before (this one is ignored). Raises :class:`ReportRefused` for a trace
        no attempt waits on: unknown, or its attempt ended first (its timeout, a cancellation).
        """
        reply = await self.command(
            "report",
            {"trace_id": trace_id, "success": success, "message": message, "output": output},
            timeout,
        )
        return not reply.message.startswith("already reported")

    async def claim(self, trace_id: str, owner: str = "python") -> bool:
        """True for the first caller of ``trace_id`` anywhere, False for every later one.

        The same fence as the Rust client's ``claim``: a create-if-absent of ``biz.<trace_id>``
        in the claims bucket. Wrap a side effect that must happen once per attempt in it.
        """
        bucket = await self._bucket("claims")
        try:
            await bucket.create(f"biz.{trace_id}", owner.encode())
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            return False


_INBOX_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _url_user(servers: Sequence[str]) -> Optional[str]:
    """The user named (with a password) in the first server URL that names one; a URL's lone
    userinfo is a token, not a name."""
    for server in servers:
        parsed = urllib.parse.urlparse(server)
        if parsed.username and parsed.password is not None:
            return urllib.parse.unquote(parsed.username)
    return None


async def connect(
    url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222",
    token: Optional[str] = None,
    prefix: str = "ax",
    namespace: Optional[str] = None,
    **options: Any,
) -> Client:
    """Connects to the NATS cluster ax runs on.

    ``token`` is an ax API token (``axt_<name>_<secret>``, made by ``ax auth token create``),
    needed when the cluster's Schedulers require one. The connection reconnects for ever on its
    own; other ``options`` go to ``nats.connect`` (credentials, TLS). With a NATS user (``user=``
    or in the URL) replies come under ``_INBOX.<user>``, the only inboxes a server configured
    as ax's docs say lets that user read; ``inbox_prefix=`` sets another. With ``namespace``
    the client acts in that namespace (see the module's doc) and its replies come under
    ``_INBOX.<namespace>``, the inboxes of the user ``ax namespace user`` prints.
    """
    if namespace is not None and not _INBOX_TOKEN.fullmatch(namespace):
        raise AxError(f"namespace `{namespace}` is not a namespace ([a-z0-9_-]{{1,64}})")
    options.setdefault("max_reconnect_attempts", -1)
    options.setdefault("reconnect_time_wait", 0.5)
    servers = [url] if isinstance(url, str) else list(url)
    user = options.get("user") or _url_user(servers)
    if namespace and "inbox_prefix" not in options:
        options["inbox_prefix"] = f"_INBOX.{namespace}"
    elif user and "inbox_prefix" not in options and _INBOX_TOKEN.fullmatch(user):
        options["inbox_prefix"] = f"_INBOX.{user}"
    nc = await nats.connect(servers=servers, **options)
    return Client(nc, token, prefix, namespace)
