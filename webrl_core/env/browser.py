"""Async Playwright over Debian's Chromium: a pool of browser processes that hand out contexts, and the
``SiteHooks`` protocol a website provider implements.

Pool contract: environment slot ``i`` gets its contexts from browser process ``i // contexts_per_browser``;
browsers start lazily and a browser that disconnected (crash, kill) is relaunched on the next
``new_context`` call. Each episode gets a fresh context (clean cookies/storage), opened with the task's
viewport, geolocation and storage_state file.

Hosts are compared as ``host:port`` strings (``url_host``), with the default port filled in.

Containment (a context opened with an allow-list; measured in tests/env/test_containment.py): Playwright's
``context.route`` aborts the requests it sees, but it does not see everything a page can send. Measured on
Chromium 156 with Playwright 1.65, a page on an allowed host reached an outside host through WebSockets (from
the page, its iframes, popups and every kind of worker), ``WebSocketStream``, shared workers (all their
requests), audio worklets, ``fetchLater``, speculation-rules prefetch/prerender, an allowed host's HTTP redirect
to an outside host (route sees only the first URL of a redirect chain), WebRTC (STUN/TURN over UDP, TURN/TCP)
and WebTransport (QUIC over UDP, ``--disable-quic`` notwithstanding). So every such context also gets
``BlackholeProxy`` as its HTTP proxy with the allowed hosts on the bypass list: Chromium's network service sends
whatever is not allowed (whichever API, realm or process asked for it) to a local socket that answers nothing;
WebTransport to a proxied host fails without sending a datagram, and WebRTC may not use UDP outside a proxy
(``--force-webrtc-ip-handling-policy``; full Chromium ignores it and gets ``NO_WEBRTC_JS``), so neither has a
path out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, runtime_checkable
from urllib.parse import urlsplit

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage",
                 # WebRTC sends STUN/TURN over UDP, which no HTTP proxy carries: with this policy it may only
                 # use the context's proxy. Measured in the headless shell: without it one RTCPeerConnection in
                 # a proxied context sent 10 datagrams to an outside port (and, unproxied, opened a TURN/TCP
                 # connection); with it none. Full Chromium ignores it: see NO_WEBRTC_JS
                 "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"]

# Full Chromium (unlike the headless shell) ignores --force-webrtc-ip-handling-policy: measured, a proxied context
# still sent 10 STUN/TURN datagrams to an outside port. There a contained context loses WebRTC in every document
# instead (Playwright runs init scripts in each frame and popup, about:blank ones included; workers have no WebRTC)
NO_WEBRTC_JS = """(() => {
  for (const k of ["RTCPeerConnection", "webkitRTCPeerConnection", "RTCDataChannel", "RTCIceCandidate",
                   "RTCSessionDescription", "RTCRtpSender", "RTCRtpReceiver", "RTCRtpTransceiver"])
    try { delete globalThis[k]; } catch (e) {}
})();"""

WEBARENA_PLACEHOLDERS = {
    "shopping": "__SHOPPING__", "shopping_admin": "__SHOPPING_ADMIN__", "reddit": "__REDDIT__",
    "gitlab": "__GITLAB__", "map": "__MAP__", "wikipedia": "__WIKIPEDIA__", "homepage": "__HOMEPAGE__",
}


def url_host(url: str) -> str:
    """``host:port`` of a URL (default ports filled in); '' for URLs without a network host."""
    parts = urlsplit(url)
    if not parts.hostname:
        return ""
    port = parts.port or {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(parts.scheme, 0)
    return f"{parts.hostname}:{port}"


def outside_hosts_pattern(allowed: Iterable[str]) -> re.Pattern:
    """A regex matching every URL with a network host NOT in ``allowed`` (``host:port`` as ``url_host`` gives).

    Routed as a regex, the match runs inside Playwright's driver, so only the blocked requests come to Python;
    a Python predicate would make every request of every page wait for this process (measured: see
    ``webrl bench rollout``)."""
    alts = []
    for hp in sorted({a.lower() for a in allowed}):
        host, _, port = hp.rpartition(":")
        h = re.escape(host)
        if ":" in host:  # IPv6 literals appear in brackets
            h = r"\[" + h + r"\]"
        alts.append(f"{h}(?::{port})?" if port in ("80", "443") else f"{h}:{port}")
    if not alts:
        return re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
    return re.compile(r"^[a-z][a-z0-9+.-]*://(?!(?:" + "|".join(alts) + r")(?:[/?#]|$))", re.IGNORECASE)


def proxy_bypass_list(allowed: Iterable[str]) -> str:
    """Chromium proxy bypass rules that let exactly the ``allowed`` ``host:port``s go direct.

    ``<-loopback>`` first: Chromium otherwise never proxies localhost/127.0.0.1/[::1], and local sites are the
    usual case (WebArena runs on localhost ports). A rule's port is compared with the URL's effective port, so
    ``127.0.0.1:80`` also covers ``http://127.0.0.1/``, and host names are compared as written: ``localhost:80``
    does not cover ``http://127.0.0.1/``, as in ``url_host`` (both measured)."""
    rules = ["<-loopback>"]
    for hp in sorted({a.lower() for a in allowed}):
        host, _, port = hp.rpartition(":")
        rules.append(f"[{host}]:{port}" if ":" in host else hp)
    return ",".join(rules)


class BlackholeProxy:
    """An HTTP proxy on 127.0.0.1 that forwards nothing: the backstop of host blocking.

    A context opened with ``proxy=hole.settings(allowed)`` connects straight to the allowed hosts (the
    bypass list) and hands every other request to this socket, whichever API, frame, worker or browser-side
    fetcher made it. Each connection's request target is passed to ``on_blocked`` (an absolute URL for plain
    HTTP; ``host:port`` for a ``CONNECT`` tunnel, which Chromium uses for https, ws and wss through a proxy)
    and the connection is closed unanswered, so the request fails (a navigation lands on Chromium's error
    page) and nothing reaches the host. Serves on the event loop that started it; only blocked traffic comes
    here, so allowed traffic pays nothing."""

    def __init__(self, on_blocked: Callable[[str], None]) -> None:
        self.on_blocked = on_blocked
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> "BlackholeProxy":
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
        return self

    def settings(self, allowed: Iterable[str]) -> dict:
        """Playwright's ``proxy`` option for ``browser.new_context``."""
        return {"server": f"http://127.0.0.1:{self.port}", "bypass": proxy_bypass_list(allowed)}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
        except (asyncio.TimeoutError, OSError, ValueError):  # ValueError: a line over the stream limit
            line = b""
        parts = line.decode("latin-1").split()
        if len(parts) >= 2:
            try:
                self.on_blocked(parts[1])
            except Exception:  # a recorder's bug must not keep the socket open
                pass
        writer.transport.abort()

    async def close(self) -> None:
        srv, self._server = self._server, None
        if srv is not None:
            srv.close()


def substitute_urls(obj: Any, url_map: dict[str, str]) -> Any:
    """Replace every placeholder (``__SHOPPING__`` ...) in all strings of a task config."""
    if isinstance(obj, str):
        # longest first, so __SHOPPING__ does not eat the start of __SHOPPING_ADMIN__
        for ph in sorted(url_map, key=len, reverse=True):
            if ph in obj:
                obj = obj.replace(ph, url_map[ph].rstrip("/"))
        return obj
    if isinstance(obj, list):
        return [substitute_urls(x, url_map) for x in obj]
    if isinstance(obj, dict):
        return {k: substitute_urls(v, url_map) for k, v in obj.items()}
    return obj


@runtime_checkable
class SiteHooks(Protocol):
    """What a website provider gives the environment.

    Optional extras that ``WebEnv`` uses when present (MiniWoB++ implements them):
    ``async after_reset(page, task, episode_id) -> dict | None`` (updates merged into the task, e.g. the intent
    read from the page), ``async episode_status(page, task) -> dict | None`` (``{"done": bool, ...}`` after each
    action), ``async evaluate_episode(page, task, answer) -> float | None`` (replaces the WebArena evaluators),
    and ``storage_state_for(task) -> str | None``.
    """

    def url_map(self) -> dict[str, str]: ...

    def allowed_hosts(self) -> list[str]: ...

    async def prepare_context(self, context, task: dict, episode_id: str) -> None: ...

    def eval_helpers(self) -> dict[str, Callable]: ...


class NoHooks:
    """Any page on any host; no login. For `webrl env play` on an arbitrary URL and for tests."""

    def __init__(self, allowed: list[str] | None = None) -> None:
        self._allowed = list(allowed or [])

    def url_map(self) -> dict[str, str]:
        return {}

    def allowed_hosts(self) -> list[str]:
        return self._allowed

    async def prepare_context(self, context, task: dict, episode_id: str) -> None:
        return None

    def eval_helpers(self) -> dict[str, Callable]:
        return {}


# ---------------------------------------------------------------------------------------------- storage states
# WebArena names them <site>_state.json, and <a>.<b>_state.json (sites sorted) for multi-site tasks;
# ``webrl webarena login`` (env/webarena_login.py) writes them.

def state_file_name(sites: Iterable[str]) -> str:
    """WebArena's file name: ``shopping_state.json``, ``gitlab.reddit_state.json`` (sites sorted)."""
    return ".".join(sorted(sites)) + "_state.json"


def sites_of_state_file(name: str, known: Iterable[str] = WEBARENA_PLACEHOLDERS) -> list[str] | None:
    """The sites a state file name stands for (``gitlab.reddit_state.json`` -> [gitlab, reddit]); None when the
    name is not ``<site>[.<site>...]_state.json`` of ``known`` sites."""
    name = Path(name).name
    if not name.endswith("_state.json"):
        return None
    sites = name[: -len("_state.json")].split(".")
    return sites if sites and all(s in known for s in sites) else None


class StateCollision(ValueError):
    """Two storage states set the same cookie (name, domain, path): merged, one site's login would be lost."""


def merge_states(states: list[dict], names: list[str] | None = None) -> dict:
    """One storage state holding the cookies and local storage of all ``states``; ``StateCollision`` when two
    set the same cookie with different values (``names`` label them in the message)."""
    names = names or [f"state {i}" for i in range(len(states))]
    cookies: dict[tuple, tuple[str, dict]] = {}
    origins: dict[str, dict[str, str]] = {}
    for name, st in zip(names, states):
        for c in st.get("cookies", []):
            key = (c.get("name"), c.get("domain"), c.get("path", "/"))
            if key in cookies and cookies[key][1].get("value") != c.get("value"):
                raise StateCollision(f"cookie {key[0]!r} of {key[1]}{key[2]} is set by both {cookies[key][0]} "
                                     f"and {name} (sites on one host share cookies)")
            cookies[key] = (name, c)
        for o in st.get("origins", []):
            ls = origins.setdefault(o["origin"], {})
            ls.update({i["name"]: i["value"] for i in o.get("localStorage", [])})
    return {"cookies": [c for _, c in cookies.values()],
            "origins": [{"origin": o, "localStorage": [{"name": k, "value": v} for k, v in ls.items()]}
                        for o, ls in origins.items()]}


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write JSON to a temporary file next to ``path`` and rename it over ``path`` (readers never see half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.chmod(tmp, 0o600)  # session cookies
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def combined_state(auth_dir: str | Path, sites: list[str]) -> Path | None:
    """``<auth_dir>/<a>.<b>_state.json`` merged from the per-site files (rewritten when one of them is newer);
    None when a per-site file is missing. ``StateCollision`` when their cookies collide."""
    auth_dir = Path(auth_dir)
    parts = [auth_dir / state_file_name([s]) for s in sites]
    if not all(p.is_file() for p in parts):
        return None
    out = auth_dir / state_file_name(sites)
    if out.is_file() and out.stat().st_mtime >= max(p.stat().st_mtime for p in parts):
        return out
    merged = merge_states([json.loads(p.read_text()) for p in parts], [p.name for p in parts])
    return write_json_atomic(out, merged)


class WebArenaHooks:
    """Real WebArena sites from a ``{site: base_url}`` dict; logins come from storage_state files.

    A task's ``storage_state`` (``./.auth/shopping_state.json`` in the official configs) is looked up as given,
    then by file name inside ``auth_dir``. A combined state (``gitlab.reddit_state.json``) that is missing, or
    older than its per-site files, is merged from ``<auth_dir>/<site>_state.json`` (``webrl webarena login``
    writes those). A missing file for a task with ``require_login`` is an error that names the file, because an
    anonymous session silently scores lower (webagents-step#2).

    Resets: before a task with ``require_reset``, ``prepare_context`` runs ``reset_command`` (``sites.reset_command``)
    through the shell, ``{sites}`` replaced by the task's sites (comma-separated) and ``{task_id}`` by its id (also
    in the environment as WEBRL_TASK_SITES / WEBRL_TASK_ID); resets run one at a time. A non-zero exit or a run
    over ``reset_timeout`` s fails the episode with the command and the tail of its output. Without a command such
    tasks run on the sites as they are, with one warning per hooks object.

    ``login_sites``: the sites that have a login (``webarena_login.LOGIN_SITES``). With it, a task that requires a
    login but names no ``storage_state`` (one the curriculum generated) uses WebArena's file for its login sites.
    """

    def __init__(self, urls: dict[str, str], auth_dir: str | os.PathLike = ".auth",
                 reset_command: str | None = None, reset_timeout: float = 900.0,
                 login_sites: Iterable[str] = ()) -> None:
        bad = sorted(set(urls) - set(WEBARENA_PLACEHOLDERS))
        if bad:
            raise ValueError(f"unknown WebArena site(s) {bad}; allowed: {sorted(WEBARENA_PLACEHOLDERS)}")
        self.urls = {k: v.rstrip("/") for k, v in urls.items()}
        self.auth_dir = Path(auth_dir)
        self.reset_command = (reset_command or "").strip() or None
        self.reset_timeout = reset_timeout
        self.login_sites = tuple(login_sites)
        self.resets = 0  # reset commands run (successfully) by this object
        self._warned_no_reset = False
        self._reset_lock: tuple[Any, asyncio.Lock] | None = None

    def url_map(self) -> dict[str, str]:
        return {WEBARENA_PLACEHOLDERS[s]: u for s, u in self.urls.items()}

    def allowed_hosts(self) -> list[str]:
        return sorted({url_host(u) for u in self.urls.values() if url_host(u)})

    def storage_state_for(self, task: dict) -> str | None:
        ref = task.get("storage_state")
        if not ref and task.get("require_login", True):
            # a task without the field (one generated by the curriculum, an embedded one): WebArena's file for
            # its sites that have a login
            logins = [s for s in task.get("sites") or [] if s in self.login_sites]
            ref = f"./.auth/{state_file_name(logins)}" if logins else None
        if not ref:
            return None
        combo = sites_of_state_file(ref)
        if combo and len(combo) > 1:
            merged = combined_state(self.auth_dir, combo)  # re-merged when a per-site file is newer
            if merged is not None:
                return str(merged)
        for cand in (self.auth_dir / Path(ref).name, Path(ref)):  # the configured folder first
            if cand.is_file():
                json.loads(cand.read_text())  # a corrupt file fails here, with its name in the traceback
                return str(cand)
        if task.get("require_login", True):
            raise FileNotFoundError(
                f"task {task.get('task_id')}: storage_state {ref!r} not found (also looked in {self.auth_dir}/); "
                f"log in to the sites and save the states first (`webrl webarena login`)")
        return None

    async def prepare_context(self, context, task: dict, episode_id: str) -> None:
        # the storage_state file already holds the login
        if task.get("require_reset"):
            await self.reset_sites(task)

    def reset_command_for(self, task: dict) -> str:
        """``reset_command`` with ``{sites}`` and ``{task_id}`` filled in (shell-quoted)."""
        sites = ",".join(task.get("sites") or [])
        return (self.reset_command or "").replace("{sites}", shlex.quote(sites)).replace(
            "{task_id}", shlex.quote(str(task.get("task_id", ""))))

    async def reset_sites(self, task: dict) -> None:
        """Run the reset command for ``task`` (see the class docstring); RuntimeError when it fails."""
        if not self.reset_command:
            if not self._warned_no_reset:
                self._warned_no_reset = True
                logging.getLogger("webrl.env").warning(
                    "task %s requires a reset of %s, but sites.reset_command is not set: tasks with require_reset "
                    "run on the sites as they are (earlier episodes' changes included)",
                    task.get("task_id"), ",".join(task.get("sites") or []) or "its sites")
            return
        loop = asyncio.get_running_loop()
        if self._reset_lock is None or self._reset_lock[0] is not loop:
            self._reset_lock = (loop, asyncio.Lock())
        async with self._reset_lock[1]:
            await self._run_reset(task)

    async def _run_reset(self, task: dict) -> None:
        cmd = self.reset_command_for(task)
        env = dict(os.environ, WEBRL_TASK_ID=str(task.get("task_id", "")),
                   WEBRL_TASK_SITES=",".join(task.get("sites") or []))
        proc = await asyncio.create_subprocess_shell(cmd, stdin=asyncio.subprocess.DEVNULL,
                                                     stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.reset_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the shell and whatever it started
            except ProcessLookupError:
                pass
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise RuntimeError(f"task {task.get('task_id')}: sites.reset_command timed out after "
                               f"{self.reset_timeout:g}s: {cmd}") from None
        if proc.returncode != 0:
            tail = (err or out).decode("utf-8", "replace").strip()[-1500:]
            raise RuntimeError(f"task {task.get('task_id')}: sites.reset_command exited with code {proc.returncode}: "
                               f"{cmd}\n{tail}")
        self.resets += 1

    def eval_helpers(self) -> dict[str, Callable]:
        from webrl_core.env.site_queries import webarena_site_helpers  # func: helpers of WebArena-Lite (REST calls)

        return webarena_site_helpers(self.urls)


class BrowserPool:
    """Chromium processes shared by environment slots (``contexts_per_browser`` slots per process)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self._pw = None
        self._pw_cm = None
        self._browsers: dict[int, Any] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self.restarts = 0

    async def start(self) -> "BrowserPool":
        if self._pw is None:
            from playwright.async_api import async_playwright
            self._pw_cm = async_playwright()
            self._pw = await self._pw_cm.__aenter__()
        return self

    async def close(self) -> None:
        for b in list(self._browsers.values()):
            try:
                await b.close()
            except Exception:  # already dead
                pass
        self._browsers.clear()
        if self._pw_cm is not None:
            try:
                await self._pw_cm.__aexit__(None, None, None)
            except Exception:
                pass
        self._pw = self._pw_cm = None

    async def __aenter__(self) -> "BrowserPool":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def browser_for(self, slot: int):
        """The live browser process of a slot, (re)launched when missing or disconnected."""
        await self.start()
        idx = slot // self.cfg.contexts_per_browser
        lock = self._locks.setdefault(idx, asyncio.Lock())
        async with lock:
            b = self._browsers.get(idx)
            if b is None or not b.is_connected():
                if b is not None:
                    self.restarts += 1
                b = await launch_chromium(self._pw, self.cfg)
                self._browsers[idx] = b
            return b

    async def new_context(self, slot: int, *, storage_state: str | None = None,
                          geolocation: dict | None = None, proxy: dict | None = None):
        """A fresh context on the slot's browser; ``proxy``: Playwright's proxy option (``BlackholeProxy``)."""
        browser = await self.browser_for(slot)
        kwargs: dict[str, Any] = {"viewport": {"width": self.cfg.viewport_width, "height": self.cfg.viewport_height}}
        if storage_state:
            kwargs["storage_state"] = storage_state
        if proxy:
            kwargs["proxy"] = proxy
        if geolocation:
            kwargs["geolocation"] = geolocation
            kwargs["permissions"] = ["geolocation"]
        ctx = await browser.new_context(**kwargs)
        if proxy and chromium_executable(self.cfg) != HEADLESS_SHELL:
            await ctx.add_init_script(NO_WEBRTC_JS)
        ctx.set_default_timeout(self.cfg.action_timeout_ms)
        ctx.set_default_navigation_timeout(max(self.cfg.action_timeout_ms, 10000))
        return ctx

    async def restart(self, slot: int) -> None:
        """Close (if still up) and forget the browser of a slot; the next context relaunches it."""
        idx = slot // self.cfg.contexts_per_browser
        b = self._browsers.pop(idx, None)
        if b is not None:
            self.restarts += 1
            try:
                await b.close()
            except Exception:
                pass


HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"  # the binary itself: /usr/bin's is a wrapper script
FULL_CHROMIUM = "/usr/bin/chromium"


async def launch_chromium(playwright, cfg):
    """A Chromium browser of ``cfg`` (the env section: ``chromium_path``, ``headless``) from an async Playwright."""
    return await playwright.chromium.launch(executable_path=chromium_executable(cfg), headless=cfg.headless,
                                            args=CHROMIUM_ARGS)


def chromium_executable(cfg) -> str:
    """The executable for ``env.chromium_path`` ("auto": the headless shell when headless and installed)."""
    path = cfg.chromium_path
    if path == "auto":
        path = HEADLESS_SHELL if cfg.headless and Path(HEADLESS_SHELL).exists() else FULL_CHROMIUM
    if not Path(path).exists():
        raise FileNotFoundError(f"env.chromium_path: {path!r} does not exist (install Debian's chromium and "
                                f"chromium-headless-shell, or set the path)")
    return path


def chromium_pids(root_pid: int | None = None) -> list[int]:
    """PIDs of chromium processes that descend from ``root_pid`` (default: this process)."""
    root_pid = os.getpid() if root_pid is None else root_pid
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
        names[int(d)] = name
    out, todo = [], [root_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            if "chrom" in names.get(c, ""):
                out.append(c)
    return out


def browser_main_pids(root_pid: int | None = None) -> list[int]:
    """The top chromium process of each browser (its parent is not chromium)."""
    pids = set(chromium_pids(root_pid))
    main = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except OSError:
            continue
        if ppid not in pids:
            main.append(p)
    return sorted(main)
