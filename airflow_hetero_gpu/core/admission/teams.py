"""Teams and their GPU quotas as an admin writes them (the teams file, docs/teams.md): parsing and
checking, one-line errors naming the team and the key.

    teams:
      research: {quota: {"*": 16}, weight: 2}
      prod:     {quota: {"A100*": 8}, lending_limit: {"A100*": 4}}
      intern:   {quota: {"*": 4}, borrowing_limit: {"*": 4}}
    usage_half_life: 24h

A fleet team may name the Airflow teams that draw on its quota (``airflow_teams: [research_cv,
research_nlp]``; default: the Airflow team of its own name); :meth:`Teams.fleet_team` translates.

The arithmetic the admission pass applies to them is :mod:`~airflow_hetero_gpu.core.admission.quota`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from airflow_hetero_gpu.core.cardtype import card_type_matches
from airflow_hetero_gpu.core.names import TEAM, name_problem, valid_name
from airflow_hetero_gpu.durations import MAX_DURATION_S
from airflow_hetero_gpu.errors import HeteroGpuError

DEFAULT_TEAM = "default"
DEFAULT_USAGE_HALF_LIFE_S = 24 * 3600.0
#: Bounds of every number of the file (docs/teams.md#bounds): GPUs of a quota or a limit are whole
#: numbers 0..MAX_GPUS (a fleet of a million GPUs is far above any real one; the pass adds them in
#: 64-bit integers); a weight lies in [MIN_WEIGHT, MAX_WEIGHT]; the half-life in
#: [MIN_HALF_LIFE_S, MAX_DURATION_S] (1 s to 365 days); max_jobs in 1..MAX_JOBS_LIMIT.
MAX_GPUS = 1_000_000
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0
MIN_HALF_LIFE_S = 1.0
MAX_JOBS_LIMIT = 100_000
TEAM_KEYS = ("quota", "borrowing_limit", "lending_limit", "weight", "max_jobs", "airflow_teams")
#: An Airflow team's name, as ``airflow teams create`` accepts it
AIRFLOW_TEAM = re.compile(r"[A-Za-z0-9_-]{3,50}")
MAX_AIRFLOW_TEAMS = 1000
FILE_KEYS = ("teams", "usage_half_life")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class TeamsError(HeteroGpuError):
    """A teams file (or mapping) is invalid; the message names the team and the key."""


def valid_team_name(name: object) -> bool:
    """A team name: letters, digits, ``_ . @ -``, at most 64, starting with a letter or digit
    (the one rule of :mod:`airflow_hetero_gpu.core.names`)."""
    return valid_name(name, TEAM)


def unknown_team(team: str, known: Iterable[str]) -> str | None:
    """One line when teams are configured (``known`` not empty) and ``team`` is none of them, else
    None. The one check of a job's team against the teams file: the operator logs it as a warning,
    ``plan --reserve --team`` refuses with it (docs/teams.md#a-team-the-file-does-not-name)."""
    names = sorted(set(known))
    if not names or team in names:
        return None
    import difflib

    close = difflib.get_close_matches(team, names, n=1)
    shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more)" if len(names) > 20 else "")
    return (f"team {team!r} is not in the teams file (its teams: {shown})"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + " A team the file does not name has quota 0: its jobs only borrow")


def specificity(pattern: str) -> tuple:
    """Sort key, most specific first: an exact name, then globs by the length of their literal
    part (longest first), ``"*"`` last; ties by the pattern."""
    glob = any(ch in pattern for ch in "*?[")
    literal = len(re.sub(r"[*?\[\]]", "", pattern))
    return (pattern.strip() == "*", glob, -literal, pattern)


def matches(card_type: str, pattern: str) -> bool:
    return pattern.strip() == "*" or card_type_matches(card_type, pattern)


@dataclass(frozen=True)
class TeamQuota:
    """One team's entitlement. Patterns of ``borrowing_limit``/``lending_limit`` are patterns of
    ``quota``; a pattern absent there is unlimited (borrowing) or lends all of its idle quota."""

    name: str
    quota: Mapping[str, int]
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)
    lending_limit: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0
    max_jobs: int | None = None  # jobs of the team that may run at once (None: no cap)
    airflow_teams: tuple[str, ...] = ()  # the Airflow teams drawing on its quota (empty: its own name)

    @property
    def mapped(self) -> tuple[str, ...]:
        """The Airflow teams whose tasks count against this team's quota."""
        return self.airflow_teams or (self.name,)

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(sorted(self.quota, key=specificity))

    def to_json(self) -> dict:
        out: dict[str, Any] = {"quota": dict(self.quota)}
        if self.borrowing_limit:
            out["borrowing_limit"] = dict(self.borrowing_limit)
        if self.lending_limit:
            out["lending_limit"] = dict(self.lending_limit)
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.max_jobs is not None:
            out["max_jobs"] = self.max_jobs
        if self.airflow_teams:
            out["airflow_teams"] = list(self.airflow_teams)
        return out


@dataclass(frozen=True)
class Teams:
    """Every team's quota (the applied teams file) and the fair-share half-life."""

    teams: Mapping[str, TeamQuota]
    usage_half_life_s: float = DEFAULT_USAGE_HALF_LIFE_S

    def __bool__(self) -> bool:
        return bool(self.teams)

    def get(self, team: str) -> TeamQuota:
        found = self.teams.get(team)
        return found if found is not None else TeamQuota(team, {})

    def fleet_team(self, airflow_team: str) -> str:
        """The fleet team whose quota a task of ``airflow_team`` draws on: the team whose
        ``airflow_teams`` names it, else the team of that name (a name no team maps is itself)."""
        for name, team in self.teams.items():
            if airflow_team in team.airflow_teams:
                return name
        return airflow_team

    def mapping(self) -> dict[str, list[str]]:
        """Fleet team -> the Airflow teams drawing on its quota (defaults included)."""
        return {n: list(t.mapped) for n, t in sorted(self.teams.items())}

    def to_json(self) -> dict:
        return {"teams": {n: t.to_json() for n, t in sorted(self.teams.items())},
                "usage_half_life": self.usage_half_life_s}

    def check_fleet(self, card_types: Iterable[str], source: str = "teams") -> None:
        """Every pattern must match some card type of the fleet (``"*"`` always does)."""
        types = sorted(set(card_types))
        for name, team in sorted(self.teams.items()):
            for key in ("quota", "borrowing_limit", "lending_limit"):
                for pattern in getattr(team, key):
                    if not any(matches(c, pattern) for c in types):
                        have = ", ".join(types) or "none"
                        raise TeamsError(f"{source}: team {name}: {key}: pattern {pattern!r} matches no card "
                                         f"of the fleet (card types: {have})")


def parse_duration(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise TeamsError(f"{where}: expected seconds or a duration like 24h, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if m is None:
            raise TeamsError(f"{where}: expected seconds or a duration like 24h, got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds) or not MIN_HALF_LIFE_S <= seconds <= MAX_DURATION_S:
        raise TeamsError(f"{where}: expected a duration from {MIN_HALF_LIFE_S:g} s to 365 days "
                         f"({MAX_DURATION_S:.0f} s), got {value!r}")
    return seconds


def _gpus_by_pattern(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise TeamsError(f"{where}: expected a mapping of card-type pattern to GPUs, got {value!r}")
    out: dict[str, int] = {}
    for pattern, n in value.items():
        if not isinstance(pattern, str) or not pattern.strip():
            raise TeamsError(f"{where}: expected a card-type pattern, got {pattern!r}")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TeamsError(f"{where}: {pattern!r}: expected a whole number of GPUs, got {n!r}")
        if n < 0:
            raise TeamsError(f"{where}: {pattern!r}: expected a number >= 0, got {n}")
        if n > MAX_GPUS:
            raise TeamsError(f"{where}: {pattern!r}: expected at most {MAX_GPUS} GPUs, got {n}")
        if pattern.strip() in out:
            raise TeamsError(f"{where}: pattern {pattern.strip()!r} given twice")
        out[pattern.strip()] = n
    return out


def _max_jobs(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS_LIMIT:
        raise TeamsError(f"{where}: max_jobs: expected a whole number from 1 to {MAX_JOBS_LIMIT}, got {value!r}")
    return value


def _airflow_teams(value: Any, where: str) -> tuple[str, ...]:
    where = f"{where}: airflow_teams"
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise TeamsError(f"{where}: expected a non-empty list of Airflow team names, got {value!r}")
    if len(value) > MAX_AIRFLOW_TEAMS:
        raise TeamsError(f"{where}: expected at most {MAX_AIRFLOW_TEAMS} Airflow teams, got {len(value)}")
    out: list[str] = []
    for name in value:
        if not isinstance(name, str) or AIRFLOW_TEAM.fullmatch(name) is None:
            shown = name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "..."
            raise TeamsError(f"{where}: invalid Airflow team {shown!r}: use 3-50 letters, digits, '_' or '-' "
                             f"(the names `airflow teams create` accepts)")
        if name in out:
            raise TeamsError(f"{where}: Airflow team {name!r} given twice")
        out.append(name)
    return tuple(out)


def _check_mapping(teams: Mapping[str, TeamQuota], source: str) -> None:
    """An Airflow team draws on one fleet team's quota: two teams mapping it are refused (the line
    names the team whose ``airflow_teams`` lists it, and the other team)."""
    owner: dict[str, str] = {}
    for name, team in teams.items():
        for airflow_team in team.mapped:
            first = owner.setdefault(airflow_team, name)
            if first != name:
                blamed, other = (name, first) if team.airflow_teams else (first, name)
                how = "its airflow_teams" if teams[other].airflow_teams else "its own name"
                raise TeamsError(f"{source}: team {blamed}: airflow_teams: Airflow team {airflow_team!r} is also "
                                 f"mapped to team {other} ({how}); an Airflow team draws on one team's quota")


def teams_from_mapping(data: Any, source: str = "teams") -> Teams:
    """Validate a teams file's content (``{teams: {name: {quota: ..., ...}}, usage_half_life: 24h}``).
    Every mistake is one :class:`TeamsError` naming the source, the team and the key."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise TeamsError(f"{source}: expected a mapping with the key 'teams', got {type(data).__name__}")
    for key in data:
        if key not in FILE_KEYS:
            raise TeamsError(f"{source}: unknown key {key!r} (expected one of: {', '.join(FILE_KEYS)})")
    half_life = DEFAULT_USAGE_HALF_LIFE_S
    if data.get("usage_half_life") is not None:
        half_life = parse_duration(data["usage_half_life"], f"{source}: usage_half_life")
    raw = data.get("teams") or {}
    if not isinstance(raw, Mapping):
        raise TeamsError(f"{source}: teams: expected a mapping of team name to its quota, got {raw!r}")
    teams: dict[str, TeamQuota] = {}
    for name, spec in raw.items():
        if not valid_name(name, TEAM):
            raise TeamsError(f"{source}: {name_problem(name, TEAM)}")
        where = f"{source}: team {name}"
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise TeamsError(f"{where}: expected a mapping with the keys {', '.join(TEAM_KEYS)}, got {spec!r}")
        for key in spec:
            if key not in TEAM_KEYS:
                raise TeamsError(f"{where}: unknown key {key!r} (expected one of: {', '.join(TEAM_KEYS)})")
        quota = _gpus_by_pattern(spec.get("quota") or {}, f"{where}: quota")
        limits = {}
        for key in ("borrowing_limit", "lending_limit"):
            limits[key] = _gpus_by_pattern(spec.get(key) or {}, f"{where}: {key}")
            for pattern in limits[key]:
                if pattern not in quota:
                    raise TeamsError(f"{where}: {key}: pattern {pattern!r} is not a pattern of its quota "
                                     f"(give it a quota, 0 if need be)")
        weight = spec.get("weight", 1)
        if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
                or not MIN_WEIGHT <= weight <= MAX_WEIGHT):
            bounds = f"a number > 0, from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
            if isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight < 0:
                raise TeamsError(f"{where}: weight: expected {bounds}, got {weight!r} (negative)")
            raise TeamsError(f"{where}: weight: expected {bounds}, got {weight!r}")
        teams[name] = TeamQuota(name, quota, limits["borrowing_limit"], limits["lending_limit"], float(weight),
                                _max_jobs(spec.get("max_jobs"), where),
                                _airflow_teams(spec.get("airflow_teams"), where))
    _check_mapping(teams, source)
    return Teams(teams, half_life)


def teams_from_text(text: str | bytes, source: str = "teams") -> Teams:
    """A teams file's YAML text (see :func:`teams_from_mapping`), read strictly
    (:mod:`~airflow_hetero_gpu.core.yamlfile`: UTF-8, size and nesting bounded, no key twice)."""
    from airflow_hetero_gpu.core.yamlfile import decode_utf8, load_strict_yaml

    if isinstance(text, bytes):
        text = decode_utf8(text, source, TeamsError)
    return teams_from_mapping(load_strict_yaml(text, source, TeamsError), source)


def read_teams_file(path: str) -> Teams:
    """The teams file at ``path`` (at most 1 MiB of UTF-8 YAML); one-line TeamsError otherwise."""
    from airflow_hetero_gpu.core.yamlfile import read_bounded

    return teams_from_text(read_bounded(path, TeamsError), path)
