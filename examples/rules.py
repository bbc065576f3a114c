"""User functions of the rules example (importable as `rules`)."""

from typing import Any


def in_force(versions: list[list[Any]], ts: int) -> dict[str, Any] | None:
    """The version of a rule valid at `ts`: the latest at or before it (None before the first)."""
    valid = [v for v in versions if v[0] <= ts]
    return max(valid, key=lambda v: v[0])[1] if valid else None


class Rules:
    """Alerts for the transactions that break the rules in force at their time.

    Rules are versions in the broadcast state, whatever order they arrive in; a
    transaction waits for event time to reach it (a timer), when every rule at or
    before it that is not late has arrived, so the alerts depend on the data only.
    """

    def process_broadcast(self, rule: dict[str, Any], ctx: Any) -> list[Any]:
        """Keep a rule version; one behind its watermark is dropped (it could change decided alerts)."""
        if ctx.timestamp > ctx.watermark:
            ctx.broadcast_state("rules").setdefault(rule["rule"], []).append([ctx.timestamp, rule])
        return []

    def process(self, txn: dict[str, Any], ctx: Any) -> list[Any]:
        """Hold a transaction until event time reaches it; name a late one."""
        if ctx.timestamp <= ctx.watermark:
            return [{"late": txn["txn"]}]
        ctx.list("waiting").append(txn)
        ctx.register_event_timer(ctx.timestamp)
        return []

    def on_timer(self, ts: int, ctx: Any) -> list[Any]:
        """Check the transactions event time reached against the rules in force at their times."""
        rules, waiting = ctx.broadcast_state("rules"), ctx.list("waiting")
        due = [t for t in waiting if t["ts"] <= ts]
        waiting[:] = [t for t in waiting if t["ts"] > ts]
        alerts = []
        for txn in due:
            limit = in_force(rules.get("max-amount", []), txn["ts"])
            if limit is not None and txn["amount"] > limit["limit"]:
                alerts.append({"alert": "max-amount", "txn": txn["txn"], "limit": limit["limit"]})
            blocked = in_force(rules.get("blocked", []), txn["ts"])
            if blocked is not None and txn["merchant"] in blocked["merchants"]:
                alerts.append({"alert": "blocked", "txn": txn["txn"], "merchant": txn["merchant"]})
        return alerts
