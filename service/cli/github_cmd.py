"""``ampci github create-app``: register ampci's GitHub App from its manifest, end to end, and write its
credentials where the compose deployment reads them.

    ampci github create-app [--org ORG] [--name NAME] [--url PUBLIC_URL] [--env-file .env]
                            [--key-file PATH] [--key-owner UID] [--port N] [--wait SECONDS] [--manifest FILE]

1. The targets are checked first (:func:`service.cli.env_file.check_targets`): nothing is asked of GitHub
   while the credentials could not be written.
2. A receiver on 127.0.0.1 (:mod:`service.cli.app_receiver`) serves the page the command prints: its form
   posts the manifest (``deploy/github-app.json`` with ``--url``, ``--name`` and the receiver as
   ``redirect_url``; :mod:`service.github_auth.manifest`) to GitHub's new-App page of the user or ``--org``.
3. GitHub redirects the browser back with a code and the state; the code is exchanged at
   ``AMPCI_GITHUB_API_URL`` (``POST /app-manifests/{code}/conversions``) for the App's id, private key and
   webhook secret.
4. The key goes to ``--key-file`` (default ``github-app.pem`` beside the ``.env``; mode 600, owned by
   ``--key-owner``, default 10001, the image's service user, when this process may give it away: compose
   mounts the file as it is on the host), and the ``.env`` (default ``./.env``, the one next to
   docker-compose.yml) gets ``AMPCI_GITHUB_APP_ID``, ``AMPCI_WEBHOOK_SECRET``, ``AMPCI_PUBLIC_URL``,
   ``AMPCI_GITHUB_PRIVATE_KEY_FILE=/run/secrets/app.pem`` and :data:`KEY_PATH_VARIABLE` (the host file
   docker-compose.yml's ``app.pem`` secret mounts there), every other line kept; all or nothing.
5. It prints the next step: install the App on the repositories (its link) and restart the stack.

The key, the webhook secret and the code are never printed or logged; a failure is one line (exit 2 for bad
input or a refused code, 3 when GitHub cannot be reached) and writes nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli.argtypes import bounded_int, path_arg, seconds, text_arg
from service.errors import ConfigError, UserError

if TYPE_CHECKING:
    from service.cli.env_file import Targets
    from service.cli.main import Subcommands
    from service.github_auth.manifest import AppCredentials

#: The compose secret holding the App's key, and where the api reads it (docker-compose.yml, README).
SECRET_TARGET = "/run/secrets/app.pem"
#: The compose variable naming the host file of that secret (docker-compose.yml: unset, /dev/null).
KEY_PATH_VARIABLE = "AMPCI_GITHUB_APP_KEY_PATH"
SERVICE_UID = 10001          # the image's service user (Dockerfile): compose mounts the key as it is on the host
DEFAULT_KEY_NAME = "github-app.pem"
CODE_LIFETIME = 3600.0       # GitHub's manifest codes expire after an hour


class NoAnswerError(UserError):
    """GitHub's redirect did not arrive in time."""


def _checked(check: Callable[[str], str], name: str, sample: str) -> Callable[[str], str]:
    """``check`` (raising ConfigError) as an argparse ``type`` with a one-line usage error."""
    def parse(raw: str) -> str:
        try:
            return check(raw)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    setattr(parse, "sample", sample)  # noqa: B010 - argtypes' convention (the hostile-argument test reads it)
    return parse


def _public_url(args: argparse.Namespace, env: dict[str, str]) -> str:
    from service.github_auth.manifest import check_public_url

    url = args.url or env.get("AMPCI_PUBLIC_URL", "")
    if not url:
        raise ConfigError("name the address GitHub reaches ampci at: --url https://HOST (or AMPCI_PUBLIC_URL in "
                          "the .env file)")
    return check_public_url(url)


def _key_path_value(targets: Targets) -> str:
    """The key file as compose should name it: relative to the .env's directory when inside it."""
    if targets.key_file.parent == targets.env_file.parent:
        return f"./{targets.key_file.name}"
    return str(targets.key_file)


def cmd_create_app(args: argparse.Namespace) -> int:
    """Run the manifest flow (module docstring); 0 once the credentials are written."""
    from service.cli.app_receiver import Receiver
    from service.cli.env_file import check_targets, read_env, updated_env, write_secrets
    from service.github_auth.manifest import (
        build_manifest,
        convert_code,
        load_template,
        registration_url,
        web_url,
    )
    from service.settings import Settings

    env_file: Path = args.env_file
    targets = check_targets(env_file, args.key_file or env_file.expanduser().absolute().parent / DEFAULT_KEY_NAME)
    dotenv = read_env(targets.env_file)
    env = {**dotenv, **os.environ}  # as compose sees them: the shell's values win over the .env file's
    settings = Settings.from_env(env)
    public_url = _public_url(args, env)
    template = load_template(args.manifest) if args.manifest else load_template()
    values = {"AMPCI_PUBLIC_URL": public_url, "AMPCI_GITHUB_PRIVATE_KEY_FILE": SECRET_TARGET,
              KEY_PATH_VARIABLE: _key_path_value(targets)}
    if dotenv.get("AMPCI_GITHUB_PRIVATE_KEY"):
        values["AMPCI_GITHUB_PRIVATE_KEY"] = ""  # the new key is the file's: one of the two, not both
    if "AMPCI_GITHUB_REPORT" not in dotenv:
        values["AMPCI_GITHUB_REPORT"] = "status,comment,check"
    updated_env("", values)  # refuses, before GitHub is asked, a path no .env line can hold

    created: list[tuple[AppCredentials, bool]] = []  # the App and whether its key has its owner

    def on_code(code: str) -> str:
        creds = convert_code(settings.github_api_url, code)
        owned = write_secrets(targets, pem=creds.pem, key_uid=args.key_owner, env_values={
            **values, "AMPCI_GITHUB_APP_ID": str(creds.app_id), "AMPCI_WEBHOOK_SECRET": creds.webhook_secret})
        created.append((creds, owned))
        return (f"ampci holds the credentials of the App {creds.name} (id {creds.app_id}). "
                f"Install it on your repositories: {creds.install_url}")

    try:
        receiver = Receiver(args.port)
    except OSError as exc:
        raise UserError(f"cannot listen on 127.0.0.1:{args.port} ({exc.strerror or type(exc).__name__})") from None
    try:
        manifest = build_manifest(template, public_url=public_url, receiver_url=receiver.callback_url,
                                  name=args.name)
        receiver.start(registration_url(web_url(settings.github_api_url), receiver.state, args.org), manifest,
                       on_code)
        print(f"Open this page in a browser on this machine to create the GitHub App "
              f"{'of ' + args.org if args.org else 'on your account'}:\n  {receiver.start_url}\n"
              f"(On a server: `ssh -L {receiver.port}:127.0.0.1:{receiver.port} SERVER`, then open it on your "
              f"computer.)  Waiting for GitHub's answer...", flush=True)
        outcome = receiver.wait(args.wait)
    finally:
        receiver.close()
    if outcome is None:
        raise NoAnswerError(f"no answer from GitHub within {args.wait:g} s: nothing was written; run the command "
                            "again")
    if outcome.error is not None:
        raise outcome.error
    _report(*created[0], targets, args.key_owner)
    return 0


def _report(creds: AppCredentials, owned: bool, targets: Targets, key_owner: int) -> None:
    """The outcome and the next steps (never a secret)."""
    print(f"Created the GitHub App {creds.name} (id {creds.app_id}, owner {creds.owner}): {creds.html_url}")
    print(f"Wrote its private key to {targets.key_file} (mode 600) and AMPCI_GITHUB_APP_ID, AMPCI_WEBHOOK_SECRET, "
          f"AMPCI_PUBLIC_URL, AMPCI_GITHUB_PRIVATE_KEY_FILE and {KEY_PATH_VARIABLE} to {targets.env_file}.")
    print("Next:")
    print(f"  1. Install the App on the repositories ampci checks: {creds.install_url}")
    step = 2
    if not owned:
        print(f"  {step}. Give the key to the service user the containers run as: "
              f"sudo chown {key_owner} {targets.key_file}")
        step += 1
    print(f"  {step}. Set AMPCI_ALLOWED_REPOS=owner/name in {targets.env_file}, then restart: "
          "docker compose up -d --build")


def register(subparsers: Subcommands) -> None:
    """Add ``github create-app``."""
    from service.github_auth.manifest import check_org, check_public_url

    p = subparsers.add_parser("github", help="the GitHub App: create it from its manifest")
    sub = p.add_subparsers(dest="github_cmd", required=True)
    c = sub.add_parser("create-app", help="create ampci's GitHub App from its manifest and write its credentials")
    c.add_argument("--org", type=_checked(check_org, "org", "acme"), default=None,
                   help="create the App of this organization (default: of your account)")
    c.add_argument("--name", type=text_arg("--name", 34), default=None,
                   help="the App's name (default: the manifest's; GitHub lets you edit it before creating)")
    c.add_argument("--url", type=_checked(check_public_url, "url", "https://ci.example.com"), default=None,
                   help="the address GitHub reaches ampci at (default: AMPCI_PUBLIC_URL of the environment "
                        "or the .env file)")
    c.add_argument("--env-file", type=path_arg, default=Path(".env"),
                   help="the .env file docker compose reads (default: ./.env)")
    c.add_argument("--key-file", type=path_arg, default=None,
                   help=f"where the private key goes (default: {DEFAULT_KEY_NAME} beside the .env file)")
    c.add_argument("--key-owner", type=bounded_int(0, 2**31 - 1), default=SERVICE_UID,
                   help=f"uid to own the key file (default {SERVICE_UID}, the containers' user; needs root)")
    c.add_argument("--port", type=bounded_int(0, 65535), default=0,
                   help="loopback port of the page and the redirect (default: any free port)")
    c.add_argument("--wait", type=seconds(1.0, CODE_LIFETIME), default=CODE_LIFETIME,
                   help="seconds to wait for GitHub's answer (default 3600)")
    c.add_argument("--manifest", type=path_arg, default=None,
                   help="the manifest template (default: deploy/github-app.json of this checkout)")
    c.set_defaults(func=cmd_create_app, serves=True)  # serves until GitHub answers (the hostile test parses it)
