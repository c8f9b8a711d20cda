"""A reload (SIGHUP): the config read again and, when valid, put in place of the running one: the
sources remade when what they read changed, the alert book rebuilt, the dispatcher told the new
rules and actions, the states of rules gone or disabled forgotten, the jobs scheduled anew. An
invalid config leaves the running one in place; what only a restart applies is said."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specguard.config.loading import Loaded, load
from specguard.daemon.intake import Intake
from specguard.daemon.jobs import Jobs
from specguard.daemon.self_status import status_line
from specguard.daemon.shared import Shared
from specguard.daemon.wiring import make_history_source, make_source, retention_for

log = logging.getLogger("specguard")


class Reloader:
    """Reads ``config_file`` and ``rule_files`` again, with the command line's ``overrides``."""

    def __init__(
        self,
        shared: Shared,
        intake: Intake,
        jobs: Jobs,
        config_file: Path | None,
        rule_files: Sequence[str],
        overrides: Mapping[str, Any],
    ) -> None:
        self.shared = shared
        self.intake = intake
        self.jobs = jobs
        self.config_file = config_file
        self.rule_files = list(rule_files)
        self.overrides = dict(overrides)

    async def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config leaves the running one in place."""
        shared = self.shared
        shared.notifier.reloading()
        try:
            new = await asyncio.to_thread(load, self.config_file, self.rule_files, self.overrides)
            if not new.ok:
                shared.metrics.config_reloads.labels("failed").inc()
                for problem in new.errors:
                    log.error("reload: %s", problem)
                log.error(
                    "reload failed: keeping the running configuration (%d problems)",
                    len(new.errors),
                )
                return False
            old = shared.loaded
            if (old.config.listen, old.config.port) != (new.config.listen, new.config.port):
                log.warning("reload: listen address changes take effect after a restart")
            if old.config.resolved_state_dir() != new.config.resolved_state_dir():
                log.warning("reload: state_dir changes take effect after a restart")
            if (old.config.server.webhook_path, old.config.server.webhook_max_body_size) != (
                new.config.server.webhook_path,
                new.config.server.webhook_max_body_size,
            ):
                log.warning(
                    "reload: webhook_path and webhook_max_body_size changes take effect after a restart"
                )
            if (
                old.config.sources != new.config.sources
                or old.prometheus_token != new.prometheus_token
                or retention_for(old) != retention_for(new)
            ):
                source = make_source(new)
                adopt = getattr(source, "adopt", None)
                if adopt is not None and type(source) is type(shared.source):
                    adopt(shared.source)  # targets kept across the reload keep their samples
                await shared.source.close()
                shared.source = source
            if (old.config.sources, old.config.history) != (new.config.sources, new.config.history):
                if shared.history_source is not None:
                    await shared.history_source.close()
                shared.history_source = make_history_source(new.config)
            shared.loaded = new
            shared.metrics.show_baseline(new.baseline)
            shared.metrics.show_rules(r.name for r in new.enabled_rules())
            await self.intake.rebuild_book()
            await self._warn_of_flags_left(old, new)
            if old.config.coordination != new.config.coordination:
                log.warning("reload: coordination changes take effect after a restart")
            shared.fleet.attach(new.actions)
            shared.dispatcher.actions = dict(new.actions)
            shared.dispatcher.set_rules(new.rules)
            shared.dispatcher.dry_run = new.config.dry_run
            await shared.forget_unconfigured()
            shared.dispatcher.wake()  # a flag held by a rule now gone, disabled or changed is let go
            self.jobs.reschedule()
            shared.metrics.config_reloads.labels("ok").inc()
            log.info("reloaded: %d rules", len(new.enabled_rules()))
            return True
        finally:
            shared.status_told = status_line(shared)
            shared.notifier.reloaded(shared.status_told)

    async def _warn_of_flags_left(self, old: Loaded, new: Loaded) -> None:
        """A feature flag the reload removes is left as it is: said when it may be engaged."""
        for name, action in old.actions.items():
            if action.reconciled and name not in new.actions:
                record = await self.shared.store.memory_read(name, "flag") or {}
                if record.get("state", "engaged" if record.get("engaged") else "restored") != "restored":
                    log.warning(
                        "reload: the feature_flag action %s is gone while its flag may be engaged: it is left "
                        "as it is; restore it by hand, or put the action back until it is restored",
                        name,
                    )
