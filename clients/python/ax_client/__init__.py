"""ax_client: apply jobs, trigger them, wait for them, read their results, claim and report.

    client = await ax_client.connect("nats://127.0.0.1:4222")
    instance = await client.trigger("report", key="order-42")
    done = await client.wait(instance.instance_id)
"""

from ._client import COMMAND_TIMEOUT, Client, connect
from ._types import (
    FINAL_STATES,
    AxError,
    CommandRefused,
    Instance,
    Log,
    Reply,
    ReportRefused,
    Result,
    format_time,
    parse_time,
)

__all__ = [
    "COMMAND_TIMEOUT",
    "FINAL_STATES",
    "AxError",
    "Client",
    "CommandRefused",
    "Instance",
    "Log",
    "Reply",
    "ReportRefused",
    "Result",
    "connect",
    "format_time",
    "parse_time",
]
