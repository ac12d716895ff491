"""What the outbox delivers to GitHub: commit statuses, the PR report comment and check runs.

Each item has a ``key`` (a newer item for the same key supersedes an unsent older one), the JSON
body GitHub expects, and a ``to_dict``/``from_dict`` form for the outbox (:func:`report_from_dict`
reads every form stored so far).  Values are checked against GitHub's rules when an item is made, so
an item GitHub would refuse (422) is a bug found here, not a dead letter later.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.json_types import JsonObject

STATES = frozenset({"pending", "success", "failure", "error"})
MAX_DESCRIPTION = 140  # GitHub truncates/rejects longer descriptions

#: The hidden marker that identifies ampci's report comment on a pull request (found again by it).
COMMENT_MARKER = "<!-- ampci:pr-report -->"
MAX_COMMENT = 65536      # GitHub refuses longer comment bodies (characters)
MAX_CHECK_TEXT = 65535   # and check-run output summary/text longer than this many bytes (UTF-8)
#: A check run's ``status`` and, once ``completed``, its ``conclusion`` (GitHub's Checks API values).
CHECK_STATUSES = frozenset({"queued", "in_progress", "completed"})
CHECK_CONCLUSIONS = frozenset({"success", "failure", "neutral", "cancelled", "timed_out", "action_required"})


@dataclass(frozen=True)
class CommitStatus:
    """One commit status to post.  ``key`` identifies (repo, sha, context): a later status for the
    same key supersedes an earlier unsent one."""

    repo: str
    sha: str
    state: str
    description: str
    target_url: str | None = None
    context: str = "ampci/smoke"

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown commit status state {self.state!r}")

    @property
    def key(self) -> str:
        return f"{self.repo.lower()}@{self.sha}#{self.context}"

    def body(self) -> dict[str, str]:
        """The JSON body GitHub expects."""
        out = {"state": self.state, "description": self.description[:MAX_DESCRIPTION],
               "context": self.context}
        if self.target_url:
            out["target_url"] = self.target_url
        return out

    def to_dict(self) -> dict[str, str | None]:
        return {"repo": self.repo, "sha": self.sha, "state": self.state, "description": self.description,
                "target_url": self.target_url, "context": self.context}

    @classmethod
    def from_dict(cls, d: JsonObject) -> CommitStatus:
        return cls(repo=d["repo"], sha=d["sha"], state=d["state"], description=d["description"],
                   target_url=d.get("target_url"), context=d.get("context", "ampci/smoke"))


@dataclass(frozen=True)
class PullRequestComment:
    """The report comment of one pull request.  ``key`` is (repo, PR): a newer body supersedes an
    unsent older one, and :meth:`GitHubStatusClient.upsert_comment` edits the comment carrying
    :data:`COMMENT_MARKER` instead of adding a second one."""

    repo: str
    pr: int
    body: str
    sha: str = ""   # the head the report is about (for logs and the dead list)

    @property
    def key(self) -> str:
        return f"{self.repo.lower()}#pr{int(self.pr)}#comment"

    def to_dict(self) -> dict[str, object]:
        return {"kind": "comment", "repo": self.repo, "pr": self.pr, "body": self.body, "sha": self.sha}

    @classmethod
    def from_dict(cls, d: JsonObject) -> PullRequestComment:
        return cls(repo=d["repo"], pr=int(d["pr"]), body=d["body"], sha=d.get("sha", ""))


@dataclass(frozen=True)
class CheckRun:
    """A check run (Checks API) for ``sha`` in one of its stages: ``queued``, ``in_progress`` or
    ``completed`` with a ``conclusion``.  ``external_id`` is the ampci run it reports (so a re-run of a
    head is a check run of its own, and every stage of one run edits the same check run).

    Guarantees: ``status`` is one of :data:`CHECK_STATUSES`; a completed check run has a conclusion
    of :data:`CHECK_CONCLUSIONS`, any other none (GitHub refuses both mistakes with 422)."""

    repo: str
    sha: str
    name: str
    conclusion: str | None
    title: str
    summary: str
    text: str = ""
    details_url: str | None = None
    status: str = "completed"
    external_id: str = ""

    def __post_init__(self) -> None:
        if self.status not in CHECK_STATUSES:
            raise ValueError(f"unknown check run status {self.status!r}")
        if self.status == "completed" and self.conclusion not in CHECK_CONCLUSIONS:
            raise ValueError(f"unknown check run conclusion {self.conclusion!r}")
        if self.status != "completed" and self.conclusion is not None:
            raise ValueError(f"a {self.status} check run has no conclusion")

    @property
    def key(self) -> str:
        """(repo, sha, name, ampci run): a later stage of one run supersedes an unsent earlier one, while
        the check run of a re-run of the same head never hides the unsent completion of the run before."""
        run = f"#run{self.external_id}" if self.external_id else ""
        return f"{self.repo.lower()}@{self.sha}#check:{self.name}{run}"

    def body(self) -> dict[str, object]:
        """The JSON body of ``POST /repos/{repo}/check-runs`` (without ``head_sha``: of the PATCH).

        ``output.summary`` and ``output.text`` each hold at most :data:`MAX_CHECK_TEXT` bytes of UTF-8 (GitHub
        counts bytes: 57,220 characters of a non-ASCII table are over 65,535 of them): a longer one is cut on a
        line (:func:`fit_bytes`) and ends with a note linking ``details_url``; the title is cut to
        :data:`MAX_DESCRIPTION` characters."""
        note = cut_note(self.details_url)
        output: dict[str, str] = {"title": self.title[:MAX_DESCRIPTION],
                                  "summary": fit_bytes(self.summary, MAX_CHECK_TEXT, note)}
        if self.text:
            output["text"] = fit_bytes(self.text, MAX_CHECK_TEXT, note)
        out: dict[str, object] = {"name": self.name, "head_sha": self.sha, "status": self.status, "output": output}
        if self.conclusion is not None:
            out["conclusion"] = self.conclusion
        if self.details_url:
            out["details_url"] = self.details_url
        if self.external_id:
            out["external_id"] = self.external_id
        return out

    def to_dict(self) -> dict[str, object]:
        return {"kind": "check", "repo": self.repo, "sha": self.sha, "name": self.name, "status": self.status,
                "conclusion": self.conclusion, "title": self.title, "summary": self.summary, "text": self.text,
                "details_url": self.details_url, "external_id": self.external_id}

    @classmethod
    def from_dict(cls, d: JsonObject) -> CheckRun:
        """Also reads check runs stored before they had stages (``status`` absent: completed)."""
        return cls(repo=d["repo"], sha=d["sha"], name=d["name"], conclusion=d.get("conclusion"), title=d["title"],
                   summary=d["summary"], text=d.get("text", ""), details_url=d.get("details_url"),
                   status=d.get("status", "completed"), external_id=d.get("external_id") or "")


def cut_note(url: str | None) -> str:
    """The closing note of a check-run field cut to GitHub's size limit, linking ``url`` (the run page)."""
    where = f"the whole report is on [the run page]({url})" if url else "the whole report is on ampci's run page"
    return f"\n\n…cut to GitHub's size limit: {where}."


def fit_bytes(text: str, limit: int, note: str) -> str:
    """``text`` when its UTF-8 form has at most ``limit`` bytes; else its longest start that fits with ``note``
    after it (cut at its last line break when one is in the last 4,096 characters, never inside a character),
    then ``note``.  The
    result's UTF-8 form has at most ``limit`` bytes whatever the characters (``note`` alone is cut to fit)."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    tail = note.encode()[:limit].decode("utf-8", "ignore")
    room = limit - len(tail.encode())
    head = raw[:max(0, room)].decode("utf-8", "ignore")  # drops a character cut in two
    line = head.rfind("\n")
    if line >= 0 and len(head) - line <= 4096:
        head = head[:line]
    return head.rstrip() + tail


#: Everything the outbox delivers to GitHub.
Report = CommitStatus | PullRequestComment | CheckRun


def report_from_dict(d: JsonObject) -> Report:
    """The report a ``to_dict`` stored (``kind`` absent: a commit status, as stored before reports had kinds)."""
    kind = d.get("kind", "status")
    if kind == "comment":
        return PullRequestComment.from_dict(d)
    if kind == "check":
        return CheckRun.from_dict(d)
    return CommitStatus.from_dict(d)
