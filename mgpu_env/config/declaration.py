"""How one setting is declared: the `Declaration` record and `setting()` that makes one.

How one setting is declared: `setting()` makes a `Settings` field whose metadata is a
`Declaration` (env var, default, help, parser, the commands that show it, its roles in a run);
`settings.py` holds the declarations themselves, this module what they are made of."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


def setting(
    env: str,
    default: str,
    help: str,
    parse: Callable[[str], Any],
    valid: str,
    *,
    metavar: str = "TEXT",
    scope: str | tuple[str, ...] = "common",
    kind: SettingKind = "value",
    short: str = "",
    help_for: Mapping[str, str] | None = None,
    roles: tuple[Role, ...] = (),
    identity: str = "",
    identity_if_set: bool = False,
) -> Any:
    """Declare one setting as a dataclass field: its env var, default text, help, parser.

    `scope` names the commands whose flags show it ("bench", or ("train", "bench")): a
    command shows no flag it would ignore; "common" settings show on every command that
    takes settings. Every command still validates every setting (and reads its env var).
    `kind` "switch" makes an on/off flag pair (`--xla/--no-xla`) instead of `--xla VALUE`;
    its text in the environment or a file is still parsed by `parse` (0/1, true/false, ...).
    `short` is a one-letter flag (`-q`); `help_for` replaces the help on one command's flags.
    `roles` say what a training run does with the setting (see `ROLES`); `identity` is its key
    in run.json's identity, and `identity_if_set` leaves it out of the identity at its default.
    """
    if set(roles) - set(ROLES) or ("identity" in roles) != bool(identity):
        raise ValueError(f"{env}: roles {roles} with identity {identity!r}")
    return field(
        default=parse(default),
        metadata={
            "env": env,
            "default": default,
            "help": help,
            "parse": parse,
            "valid": valid,
            "metavar": metavar,
            "scope": (scope,) if isinstance(scope, str) else scope,
            "kind": kind,
            "short": short,
            "help_for": dict(help_for or {}),
            "roles": roles,
            "identity": identity,
            "identity_if_set": identity_if_set,
        },
    )


SettingKind = Literal["value", "switch"]
# What a training run does with a setting, declared on the setting itself; every list of
# setting names the run keeps (`with_role`) is derived from these.
Role = Literal["shown", "recorded", "resumed", "identity", "agreed", "script"]
ROLES: dict[Role, str] = {
    "shown": "a setting of mgpu train's run: in its start summary, --dry-run and metrics.json",
    "recorded": "written to the run folder's settings.json when a run starts",
    "resumed": "taken from settings.json when the same OUTPUT_DIR is started again",
    # What a resume may change is decided here, once: a setting with this role may not
    # change (refused naming it, both values and the fix); any other may (EPOCHS only up).
    "identity": "in run.json's identity: may not change on resume (a folder whose identity "
                "differs is refused, naming the setting and both values)",
    "agreed": "equal on every worker of a multi-worker run (checked before training)",
    "script": "decided by a user's script under mgpu run, not applied by mgpu",
}


@dataclass(frozen=True)
class Declaration:
    """One setting's declaration, as read back from its `Settings` field."""

    field_name: str
    env: str
    default: str
    help: str
    valid: str
    metavar: str
    scope: tuple[str, ...]  # ("common",) or the commands that use it
    parse: Callable[[str], Any]
    kind: SettingKind = "value"
    short: str = ""
    help_for: Mapping[str, str] = field(default_factory=dict)
    roles: tuple[Role, ...] = ()  # what a training run does with it: see ROLES
    identity: str = ""  # its key in run.json's identity, for the role "identity"
    identity_if_set: bool = False  # in the identity only when not at its default

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")

    @property
    def off_flag(self) -> str:
        """A switch's "off" flag: --no-xla."""
        return "--no-" + self.flag.removeprefix("--")

    def help_on(self, command: str) -> str:
        """The help text on one command's flags (most share the common one)."""
        return self.help_for.get(command, self.help)
