"""The tools' arguments: one model per tool (unknown keys refused: no argument reaches policy),
their descriptions, and the JSON schemas both surfaces publish."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

WORKSPACE = "/workspace"


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str | None = Field(
        None, description="The session; defaults to the connection's session."
    )


class RunCode(Args):
    code: str = Field(description="Source code to run.")
    language: Literal["python", "javascript", "bash"] = "python"
    timeout_s: float = Field(60, gt=0, description="Seconds before the run is stopped.")


class RunCommand(Args):
    command: str = Field(description="Shell command, run with bash -l -c.")
    timeout_s: float = Field(60, gt=0, description="Seconds before the command is killed.")
    cwd: str | None = Field(None, description="Working directory (default /workspace).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    background: bool = Field(False, description="Return once started; the process keeps running.")


class ReadFile(Args):
    path: str = Field(description="File path; relative paths are under /workspace.")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class WriteFile(Args):
    path: str = Field(description="File path; relative paths are under /workspace.")
    content: str = Field(description="File content, in `encoding`.")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ListFiles(Args):
    path: str = Field(WORKSPACE, description="Directory to list.")
    depth: int = Field(1, ge=1, le=5, description="How many levels to descend.")


class Upload(Args):
    path: str = Field(description="Destination path in the sandbox.")
    content_base64: str = Field(description="The file's bytes, base64-encoded.")


class Download(Args):
    path: str = Field(description="File to fetch; returned base64-encoded.")


class PublishDeliverable(Args):
    path: str = Field(description="File in the sandbox to publish.")
    name: str | None = Field(None, description="Name of the deliverable (default: file name).")


class SessionStatus(Args):
    pass


class CloseSession(Args):
    pass


DESCRIPTIONS = {
    "run_code": "Run Python, JavaScript or bash code in the session's sandbox (rich results "
    "such as charts and tables where the template has the code interpreter).",
    "run_command": "Run a shell command in the session's sandbox, optionally in the background.",
    "read_file": "Read a file from the session's sandbox.",
    "write_file": "Write a text (or base64) file in the session's sandbox.",
    "list_files": "List a directory of the session's sandbox.",
    "upload": "Upload a binary file (base64) into the session's sandbox.",
    "download": "Download a file (base64) from the session's sandbox.",
    "publish_deliverable": "Copy a file to the deliverables store; returns its id and URL.",
    "session_status": "The session, its sandbox's state and the provider's capabilities.",
    "close_session": "Close the session: its sandbox is killed; the workspace is kept or "
    "deleted per the tenant's policy.",
}
MODELS: dict[str, type[Args]] = {
    "run_code": RunCode,
    "run_command": RunCommand,
    "read_file": ReadFile,
    "write_file": WriteFile,
    "list_files": ListFiles,
    "upload": Upload,
    "download": Download,
    "publish_deliverable": PublishDeliverable,
    "session_status": SessionStatus,
    "close_session": CloseSession,
}


def describe(e: ValidationError) -> str:
    problems = []
    for err in e.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown argument {loc!r} (policy is not a tool argument)")
        else:
            problems.append(f"{loc}: {err['msg']}")
    return "invalid arguments: " + "; ".join(problems)


def tool_schemas() -> list[dict[str, Any]]:
    return [
        {"name": name, "description": DESCRIPTIONS[name], "input_schema": model.model_json_schema()}
        for name, model in MODELS.items()
    ]
