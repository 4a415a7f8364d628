"""Request bodies of the management API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat

from msgbus.models import (
    APP_DESTINATION_PATTERN,
    NAME_PATTERN,
    BrokerKind,
    ConfigModel,
    Integer,
    PublishPolicy,
    ReplaySpec,
    SchemaCompatibility,
    SubscribePolicy,
    SubscriptionSettings,
)
from msgbus.teams import TeamName
from msgbus.users import MIN_PASSWORD_LENGTH, Role


class DestinationIn(ConfigModel):
    broker: BrokerKind = BrokerKind.DIRECT
    description: str = Field(default="", max_length=2000)
    team: TeamName | None = Field(
        default=None, description="the team that owns it; default: its team now, or, for a new "
                                  "one, the caller's team when the caller is in exactly one")
    owner: str | None = Field(default=None, max_length=200,
                              description="deprecated, renamed `team` in 0.2: a label here "
                                          "names a team as an upgrade does (msgbus/teams.py)")
    partitions: Integer = Field(default=4, ge=1, le=256)
    record_rate_per_s: StrictFloat = Field(
        default=0, ge=0, le=10_000_000,
        description="MongoDB record writes/s of each receiver; 0: unlimited")
    publishers: PublishPolicy | None = Field(
        default=None, description="which producer apps may send to it: `any` app whose own "
                                  "list names it, its `team`'s apps, or `listed` ones only "
                                  "(with publisher_apps); default: as now, `team` for a new one")
    publisher_apps: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(
        default=None, max_length=1000, description="apps that may send to it besides")
    subscribers: SubscribePolicy | None = Field(
        default=None, description="which teams may subscribe: `any`, listed `teams`, or on "
                                  "its team's `approval`; default: as now, `any` for a new one")
    subscriber_teams: list[TeamName] | None = Field(
        default=None, max_length=1000, description="teams that may subscribe besides")


class SchemaIn(BaseModel):
    """A new version of a destination's payload schema."""

    schema_: dict[str, Any] | StrictBool = Field(
        alias="schema", description="a JSON Schema, draft 2020-12")
    compatibility: SchemaCompatibility | None = Field(
        default=None, description="checked against the latest version now and from now on; "
                                  "default: the latest version's (backward for the first)")

    model_config = ConfigDict(populate_by_name=True)


class RuntimeIn(ConfigModel):
    """A change of the runtime settings: fields left out keep their value."""

    record_rate_per_s: StrictFloat | None = Field(
        default=None, ge=0, le=10_000_000,
        description="MongoDB record writes/s of each receiver, all destinations; 0: unlimited")
    active_clusters: dict[BrokerKind, Annotated[str, Field(max_length=100)]] | None = Field(
        default=None, description="Per broker kind, the cluster receivers publish to: one of "
                                  "the clusters GET /v1/runtime lists")


class SubscriptionIn(SubscriptionSettings):
    """A subscription's settings; its destination and name are in the path."""

    team: TeamName | None = Field(
        default=None, description="the team that owns it; default: its team now, or, for a new "
                                  "one, the caller's team when the caller is in exactly one, "
                                  "else the destination's")


# how long pushes are also signed with the previous secret after a rotation, by default
DEFAULT_SECRET_OVERLAP_S = 24 * 3600


class RotateIn(ConfigModel):
    overlap_s: StrictFloat | None = Field(
        default=DEFAULT_SECRET_OVERLAP_S, ge=0, le=30 * 24 * 3600,
        description="how long pushes are also signed with the previous secret (seconds); "
                    "null: until DELETE .../secrets/previous")


class BreakGlassIn(BaseModel):
    reason: str = Field(min_length=10, max_length=1000,
                        description="why every destination's messages must be read (audited)")
    minutes: Integer = Field(default=30, ge=1, le=60, description="how long, at most an hour")


class AppIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    destinations: list[Annotated[str, Field(pattern=APP_DESTINATION_PATTERN)]] = Field(
        default_factory=lambda: ["*"], min_length=1, max_length=10_000,
        description="destination codes it may send to; '*' for every one")
    team: TeamName | None = Field(
        default=None, description="the team that owns it; default: the caller's team when the "
                                  "caller is in exactly one")


# ASCII spelled out: \w is ASCII in JSON Schema (ECMA-262), Unicode in pydantic (Rust)
OPERATOR_PATTERN = r"^[A-Za-z0-9_.@+-]{1,100}$"


class ReplayIn(ReplaySpec):
    """A replay job. With `dry_run` only its count comes back; otherwise the job is created in
    state `planned` with that count, to be started (`POST /v1/replays/{id}/start`)."""

    dry_run: StrictBool = False
    requested_by: str | None = Field(
        default=None, pattern=OPERATOR_PATTERN,
        description="who asks, for the audit record when the shared bootstrap token is used "
                    "(a user's own session or token names the user)")


class OperatorIn(BaseModel):
    requested_by: str | None = Field(default=None, pattern=OPERATOR_PATTERN)


class RedriveIn(BaseModel):
    message_ids: list[str] | None = Field(
        default=None, max_length=10_000,
        description="only these messages' parked deliveries; None: every parked delivery of "
                    "the subscription")
    requested_by: str | None = Field(default=None, pattern=OPERATOR_PATTERN)


class LoginIn(BaseModel):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class UserIn(BaseModel):
    """Create a user (password and role required) or change one (fields left out stay)."""

    password: str | None = Field(default=None, min_length=MIN_PASSWORD_LENGTH, max_length=1024)
    role: Role | None = None
    disabled: StrictBool | None = None


class TokenIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="what the token is for")
    role: Role | None = Field(default=None,
                              description="acts with this role at most; default the user's")
    expires_in_days: Integer = Field(default=90, ge=1, le=365, description="it stops working then")


class TeamTokenIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="what the token is for")
    role: Literal["viewer", "maintainer"] = Field(
        default="maintainer", description="acts as this member of the team (never an owner)")
    expires_in_days: Integer = Field(default=90, ge=1, le=365, description="it stops working then")


class DiscardIn(BaseModel):
    message_ids: list[str] | None = Field(
        default=None, max_length=10_000,
        description="only these messages' parked deliveries; None: every parked delivery of "
                    "the subscription")
    reason: str = Field(min_length=1, max_length=500, description="why, for the audit log")


class ScheduledIn(BaseModel):
    message_ids: list[Annotated[str, Field(max_length=100)]] = Field(
        min_length=1, max_length=1000, description="the messages whose scheduled deliveries "
                                                   "to act on")
    requested_by: str | None = Field(default=None, pattern=OPERATOR_PATTERN)


class ScheduledCancelIn(ScheduledIn):
    reason: str = Field(min_length=1, max_length=500, description="why, for the audit log")
