"""A local Prefect stack: server on 127.0.0.1, process work pool, deployments from infra/prefect.yaml, one worker.

Stop order matters (stack.md P5): workers first (SIGINT, then a second SIGINT if it hangs), then the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
POOL = "webrl-pool"


class PrefectStack:
    def __init__(self, home: str | Path, port: int = 4200, worker_poll_s: float = 10.0, run_root: str | Path = "runs"):
        self.home = Path(home).resolve()
        self.port = port
        self.api = f"http://127.0.0.1:{port}/api"
        self.run_root = Path(run_root).resolve()
        self.worker_poll_s = worker_poll_s
        self.server: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return dict(os.environ, PREFECT_HOME=str(self.home), PREFECT_API_URL=self.api,
                    PREFECT_SERVER_ANALYTICS_ENABLED="false", WEBRL_REPO=str(REPO),
                    PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(self.run_root / ".prefect-results"),
                    PREFECT_WORKER_QUERY_SECONDS=str(self.worker_poll_s), TOKENIZERS_PARALLELISM="false")

    def _prefect(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        exe = str(Path(sys.executable).parent / "prefect")
        return subprocess.run([exe, *args], env=self.env(), cwd=REPO, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def start_server(self, timeout: float = 120) -> None:
        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "server.log", "a")
        self.server = subprocess.Popen([exe, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                                       env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.server.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.server.returncode}; see {self.home / 'server.log'}")
            try:
                if httpx.get(self.api + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"prefect server not healthy after {timeout}s; see {self.home / 'server.log'}")

    def deploy(self) -> None:
        r = self._prefect("work-pool", "create", POOL, "--type", "process", check=False)
        if r.returncode != 0 and "already exists" not in (r.stdout + r.stderr):
            raise RuntimeError(f"work-pool create failed: {r.stdout}{r.stderr}")
        r = self._prefect("--no-prompt", "deploy", "--all", "--prefect-file", str(REPO / "infra" / "prefect.yaml"),
                          check=False, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"prefect deploy failed:\n{r.stdout}\n{r.stderr}")

    def start_worker(self) -> None:
        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "worker.log", "a")
        self.worker = subprocess.Popen([exe, "worker", "start", "--pool", POOL], env=self.env(), cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.worker and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGINT)
            try:
                self.worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.worker.send_signal(signal.SIGINT)  # the second SIGINT makes it kill itself
                try:
                    self.worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.worker.pid, signal.SIGKILL)
        if self.server and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
