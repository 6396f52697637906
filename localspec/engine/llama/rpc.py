"""The target spread over llama.cpp RPC servers: the layout, the servers' check, their devices, lost servers.

llama.cpp's RPC backend (built with scripts/patches/llama-cpp-rpc.patch) is reached through ggml's backend
registry, as upstream's ``--rpc`` does it: the "RPC" registry's ``ggml_backend_rpc_add_server`` gives each
server's devices, which reach the model through ``llama_model_params.devices``. Before llama.cpp connects,
each server is checked here over a socket of its own (HELLO, then localspec's build id), so a server that is
down, speaks another protocol or runs another build is refused with the reason instead of llama.cpp's abort.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from localspec.engine.llama.kernels import exact_kernels_built
from localspec.engine.llama.library import lib_dir, library_file
from localspec.engine.llama.machine import default_threads
from localspec.errors import LocalspecError, UsageError

# ggml-rpc.cpp's wire format: | command (1 byte) | size (8 bytes) | data |; answers | size (8 bytes) | data |.
_HELLO = 14
_CONN_CAPS = 24  # transport.h: RPC_CONN_CAPS_SIZE; all zero asks for plain TCP
_LOCALSPEC_BUILD = 0x4C  # llama-cpp-rpc.patch: RPC_CMD_LOCALSPEC_BUILD
# A pass that makes no progress for this long on one server counts it lost (GGML_RPC_TIMEOUT_MS, see the patch):
# a stalled server is named within it. Raise it for targets whose single pass takes longer on a server.
DEFAULT_TIMEOUT_S = 8.0
CONNECT_TIMEOUT_S = 5.0


class RpcServerError(LocalspecError):
    """An RPC server is unreachable, of another build, or was lost mid-answer; ``server`` names it."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server


@dataclass(frozen=True)
class RpcLayout:
    """Where the target's layers go: ``split[0]`` is this machine's share, then one per server in order.

    The last layers go to the servers (llama.cpp offloads the top of the stack), so embeddings, the first
    layers and the output layer stay here and the logits never cross the network.
    """

    servers: tuple[str, ...]
    split: tuple[float, ...]

    def offloaded_layers(self, n_layers: int) -> int:
        """How many of the target's ``n_layers`` go to the servers (llama.cpp's n_gpu_layers)."""
        return round(n_layers * (1 - self.split[0] / sum(self.split)))

    def server_split(self) -> tuple[float, ...]:
        """The servers' shares as llama.cpp's ``--tensor-split`` takes them (over its devices only)."""
        return self.split[1:]

    def identity(self) -> str:
        return f"rpc {','.join(self.servers)} split {','.join(f'{s:g}' for s in self.split)}"


def parse_layout(servers: str | Sequence[str], split: str | None = None) -> RpcLayout:
    """``HOST:PORT[,HOST:PORT]`` (or a list of them) and ``--tensor-split`` (this machine's share first, then one
    per server; default equal shares)."""
    names = [s.strip() for s in (servers.split(",") if isinstance(servers, str) else servers) if s.strip()]
    if not names:
        raise UsageError("--rpc needs HOST:PORT[,HOST:PORT...]")
    for name in names:
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--rpc: '{name}' is not HOST:PORT (e.g. 192.168.1.20:50052)")
    if len(set(names)) != len(names):
        raise UsageError("--rpc names a server twice; give each HOST:PORT once")
    if split is None:
        shares = (1.0,) * (len(names) + 1)
    else:
        try:
            shares = tuple(float(s) for s in split.split(","))
        except ValueError:
            raise UsageError(f"--tensor-split '{split}' is not comma-separated numbers") from None
        if len(shares) != len(names) + 1 or any(s < 0 for s in shares) or not sum(shares) > 0:
            raise UsageError(
                f"--tensor-split needs {len(names) + 1} non-negative shares: this machine's first, then one per "
                f"--rpc server (e.g. {','.join(['1'] * (len(names) + 1))})"
            )
    return RpcLayout(tuple(names), shares)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def _ask(sock: socket.socket, command: int, payload: bytes) -> bytes:
    sock.sendall(struct.pack("<BQ", command, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size > 4096:
        raise ConnectionError(f"answered with {size} bytes")
    return _recv_exact(sock, size)


def server_build(server: str, *, timeout: float = CONNECT_TIMEOUT_S) -> tuple[str, str | None]:
    """(protocol "7.0.0", build id or None for a server without localspec's patch) as ``server`` reports them."""
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            hello = _ask(sock, _HELLO, bytes(_CONN_CAPS))
            if len(hello) != 4 + _CONN_CAPS:
                raise RpcServerError(server, f"RPC server {server} answered HELLO with {len(hello)} bytes: not "
                                     "llama.cpp's rpc-server of this version; start it with 'localspec rpc-server'")
            protocol = f"{hello[0]}.{hello[1]}.{hello[2]}"
            try:
                build = _ask(sock, _LOCALSPEC_BUILD, b"").decode(errors="replace")
            except (ConnectionError, OSError):  # a stock server drops the connection on the unknown command
                build = None
    except TimeoutError:
        raise RpcServerError(server, f"RPC server {server} did not answer within {timeout:g} s; it serves one "
                             "client at a time: stop the other one using it, or restart it") from None
    except (ConnectionError, OSError) as exc:
        raise RpcServerError(server, f"cannot reach RPC server {server} ({exc}); start it there with "
                             f"'localspec rpc-server --host HOST --port {port}'") from None
    return protocol, build


def check_servers(servers: Sequence[str]) -> None:
    """Refuse, in one line, a server that is down or runs another protocol or build than this process."""
    local = local_build()
    local_protocol = local.partition(",")[0].removeprefix("protocol ")
    for server in servers:
        protocol, build = server_build(server)
        if protocol != local_protocol:
            raise RpcServerError(server, f"RPC server {server} speaks protocol {protocol}, this build {local_protocol}: "
                                 "run the same localspec version there ('localspec rpc-server')")
        if build is None:
            raise RpcServerError(server, f"RPC server {server} is not localspec's build (stock llama.cpp rpc-server?): "
                                 "its kernels are not the exact ones; start it with 'localspec rpc-server'")
        if build != local:
            raise RpcServerError(server, f"RPC server {server} runs another build ({build}; here: {local}): "
                                 "set up the same localspec version there (scripts/setup)")


def server_command(host: str, port: int, *, threads: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of llama.cpp's rpc-server from this very build (it ships beside the
    libraries, see scripts/patches/llama-cpp-python-rpc.patch), running the kernels this process would."""
    binary = lib_dir() / "ggml-rpc-server"
    if not binary.is_file():
        raise LocalspecError("this llama-cpp-python build has no rpc-server; rerun scripts/setup")
    env = dict(os.environ)
    # The exact kernels are switched on by the environment, in every process that runs them.
    if exact_kernels_built():
        env["GGML_CPU_TILED_MM"] = "exact"
    command = [str(binary), "--host", host, "--port", str(port), "--threads", str(threads or default_threads())]
    return command, env


# -- ggml's registry --------------------------------------------------------------------------------------------
@functools.cache
def _ggml() -> ctypes.CDLL:
    path = library_file(lib_dir(), "ggml")
    if path is None:
        raise LocalspecError("llama.cpp's ggml library is missing from llama-cpp-python; rerun scripts/setup")
    ggml = ctypes.CDLL(str(path))
    p = ctypes.c_void_p
    for name, args, result in (
        ("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
        ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
        ("ggml_backend_reg_dev_count", [p], ctypes.c_size_t),
        ("ggml_backend_reg_dev_get", [p, ctypes.c_size_t], p),
        ("ggml_backend_dev_name", [p], ctypes.c_char_p),
        ("ggml_backend_dev_description", [p], ctypes.c_char_p),
        ("ggml_backend_dev_memory", [p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
    ):
        function = getattr(ggml, name)
        function.argtypes, function.restype = args, result
    return ggml


def _rpc_function(name: str, restype, *argtypes):
    """One of ggml-rpc's functions through the registry's proc address (the library may be loaded on demand)."""
    ggml = _ggml()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise LocalspecError(f"this llama.cpp build has no RPC backend ({name} missing); rerun scripts/setup")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def local_build() -> str:
    """This process's RPC build id, as its servers must report it ("protocol 7.0.0, llama-cpp-python-...")."""
    return _rpc_function("ggml_backend_rpc_build", ctypes.c_char_p)().decode()


def server_devices(servers: Sequence[str]) -> list[int]:
    """The ggml devices of ``servers`` (each server's, in order), connecting to each; check_servers first."""
    add_server = _rpc_function("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
    ggml = _ggml()
    os.environ.setdefault("GGML_RPC_TIMEOUT_MS", str(int(DEFAULT_TIMEOUT_S * 1000)))
    devices = []
    for server in servers:
        reg = add_server(server.encode())
        if not reg or lost_servers([server]):
            raise RpcServerError(server, f"RPC server {server} was lost while connecting; check it and retry")
        devices += [ggml.ggml_backend_reg_dev_get(reg, i) for i in range(ggml.ggml_backend_reg_dev_count(reg))]
    return devices


def device_descriptions(servers: Sequence[str]) -> list[str]:
    """One line per RPC device, "RPC0 (127.0.0.1:50052): 1.2 of 23.4 GiB free", for doctor."""
    ggml = _ggml()
    lines = []
    for device in server_devices(servers):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        name = ggml.ggml_backend_dev_name(device).decode(errors="replace")
        where = ggml.ggml_backend_dev_description(device).decode(errors="replace")
        lines.append(f"{name} ({where}): {free.value / 2**30:.1f} of {total.value / 2**30:.1f} GiB free")
    return lines


# Servers whose connection failed in this process: ggml-rpc reports each once, and every model on them is broken.
_lost: set[str] = set()


def lost_servers(servers: Sequence[str]) -> list[str]:
    """Those of ``servers`` whose connection failed or timed out in this process (since ``forget_lost``)."""
    function = _rpc_function("ggml_backend_rpc_lost_server", ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    buffer = ctypes.create_string_buffer(256)
    while function(buffer, len(buffer)):
        _lost.add(buffer.value.decode())
    return [server for server in servers if server in _lost]


def forget_lost(servers: Sequence[str]) -> None:
    """A model is loaded anew on ``servers``: their earlier losses belong to models that are gone."""
    lost_servers(())  # collect what ggml-rpc still holds, so it is forgotten too
    _lost.difference_update(servers)


def device_array(devices: Sequence[int]) -> ctypes.Array:
    """``devices`` as llama_model_params.devices takes them: NULL-terminated (keep the array referenced)."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
