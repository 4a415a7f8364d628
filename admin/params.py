"""Path parameters of the management API, with the patterns their values must match: a value
outside them (non-ASCII, too long, control characters) is a 422 naming the parameter, and the
OpenAPI document says so."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from msgbus.models import CODE_PATTERN, NAME_PATTERN
from msgbus.store.documents import CONFIG_PARSERS
from msgbus.teams import TEAM_PATTERN
from msgbus.users import USERNAME_PATTERN

# ids the bus makes (replays, tokens: UUIDv7) and ids of stored documents, which may be anything
# an old version or a hand edit wrote: printable, bounded
PRINTABLE_ID_PATTERN = r"^[^\x00-\x1f\x7f]{1,300}$"

DestinationCode = Annotated[str, Path(pattern=CODE_PATTERN, description="a destination's code")]
SubscriptionName = Annotated[str, Path(pattern=NAME_PATTERN,
                                       description="a subscription's name")]
AppName = Annotated[str, Path(pattern=NAME_PATTERN, description="a producer app's name")]
UserName = Annotated[str, Path(pattern=USERNAME_PATTERN, description="a user's name")]
GeneratedId = Annotated[str, Path(pattern=r"^[0-9a-f-]{36}$", description="an id msgbus made")]
ConfigCollection = Annotated[str, Path(
    pattern="^(" + "|".join(CONFIG_PARSERS) + ")$",
    description="a collection of configuration: " + ", ".join(CONFIG_PARSERS))]
StoredId = Annotated[str, Path(pattern=PRINTABLE_ID_PATTERN,
                               description="the stored document's _id")]

DestinationQuery = Annotated[str | None, Query(pattern=CODE_PATTERN,
                                               description="only this destination's")]
BizIdQuery = Annotated[str | None, Query(min_length=1, max_length=256,
                                         pattern=PRINTABLE_ID_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many")]
TeamQuery = Annotated[str | None, Query(pattern=TEAM_PATTERN, description="a team's name")]
TargetQuery = Annotated[str | None, Query(max_length=300, pattern=PRINTABLE_ID_PATTERN,
                                          description="only entries about this target")]
SubscriptionQuery = Annotated[str | None, Query(
    max_length=300, pattern=r"^[^\x00-\x1f\x7f/]{1,140}/[^\x00-\x1f\x7f/]{1,140}$",
    description="only messages recorded for this subscription (destination/name)")]
CursorQuery = Annotated[str | None, Query(
    max_length=400, pattern=PRINTABLE_ID_PATTERN,
    description="a cursor of the message list (the x-next-cursor or x-previous-cursor header)")]
