"""A headless Chromium driven over the DevTools protocol, with the standard library only.

``Browser`` starts ``chromium --headless --remote-debugging-port=0`` on a fresh profile (every
background connection off: nothing leaves the machine), connects to the page's DevTools websocket
with a minimal RFC 6455 client, and offers what the report tests need: open a file URL while
collecting console messages and uncaught exceptions, evaluate JavaScript, click at an element's
centre with real mouse events, and take a screenshot. Used by tests/report/test_views.py and by
scripts/head_view_screenshot.py (the README picture); without a Chromium binary ``find_chromium``
returns None and the tests skip.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
  for name in CANDIDATES:
    found = shutil.which(name)
    if found:
      return found
  return None


class _WebSocket:
  """Text frames over one TCP connection (client side: masked frames out, plain frames in)."""

  def __init__(self, url: str, timeout: float):
    m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
    host, port, path = m.group(1), int(m.group(2)), m.group(3)
    self.sock = socket.create_connection((host, port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
      chunk = self.sock.recv(4096)
      if not chunk:
        raise ConnectionError("websocket handshake failed")
      head += chunk
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
      raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")
    self.buffer = head.split(b"\r\n\r\n", 1)[1]

  def send(self, text: str):
    payload = text.encode()
    n = len(payload)
    header = bytes([0x81])
    if n < 126:
      header += bytes([0x80 | n])
    elif n < 65536:
      header += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
      header += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

  def _read(self, n: int) -> bytes:
    while len(self.buffer) < n:
      chunk = self.sock.recv(1 << 16)
      if not chunk:
        raise ConnectionError("websocket closed")
      self.buffer += chunk
    out, self.buffer = self.buffer[:n], self.buffer[n:]
    return out

  def recv(self) -> str:
    message = b""
    while True:
      b0, b1 = self._read(2)
      n = b1 & 0x7F
      if n == 126:
        n = struct.unpack(">H", self._read(2))[0]
      elif n == 127:
        n = struct.unpack(">Q", self._read(8))[0]
      mask = self._read(4) if b1 & 0x80 else None
      data = self._read(n)
      if mask:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
      if b0 & 0x0F == 0x8:
        raise ConnectionError("websocket closed by the browser")
      if b0 & 0x0F in (0x9, 0xA):  # ping / pong: not used by DevTools
        continue
      message += data
      if b0 & 0x80:
        return message.decode()

  def close(self):
    try:
      self.sock.close()
    except OSError:
      pass


class Browser:
  """One headless Chromium page (context manager)."""

  def __init__(self, chromium: str, *, width: int = 1400, height: int = 1000, timeout: float = 60.0):
    self.timeout = timeout
    self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
    self.proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--hide-scrollbars",
         "--force-device-scale-factor=1", f"--window-size={width},{height}",
         f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = self._port()
    page = None
    deadline = time.time() + timeout
    while page is None and time.time() < deadline:
      with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
        page = next((t for t in json.load(r) if t.get("type") == "page"), None)
      if page is None:
        time.sleep(0.1)
    if page is None:
      raise RuntimeError("Chromium opened no page")
    self.ws = _WebSocket(page["webSocketDebuggerUrl"], timeout)
    self.next_id = 0
    self.events: list[dict] = []
    for domain in ("Page", "Runtime", "Log"):
      self.call(f"{domain}.enable")

  def _port(self) -> int:
    deadline = time.time() + self.timeout
    lines = []
    while time.time() < deadline:
      line = self.proc.stderr.readline()
      if not line:
        break
      lines.append(line)
      m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
      if m:
        return int(m.group(1))
    raise RuntimeError("Chromium did not start its DevTools server:\n" + "".join(lines[-20:]))

  def call(self, method: str, **params) -> dict:
    self.next_id += 1
    my_id = self.next_id
    self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
    while True:
      msg = json.loads(self.ws.recv())
      if msg.get("id") == my_id:
        if "error" in msg:
          raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})
      if "method" in msg:
        self.events.append(msg)

  def wait_for(self, method: str, timeout: float | None = None) -> dict:
    deadline = time.time() + (timeout or self.timeout)
    for i, e in enumerate(self.events):
      if e["method"] == method:
        return self.events.pop(i)
    while time.time() < deadline:
      msg = json.loads(self.ws.recv())
      if msg.get("method") == method:
        return msg
      if "method" in msg:
        self.events.append(msg)
    raise TimeoutError(method)

  def open(self, path_or_url) -> None:
    url = str(path_or_url)
    if "://" not in url:
      url = Path(url).resolve().as_uri()
    self.call("Page.navigate", url=url)
    self.wait_for("Page.loadEventFired")

  def evaluate(self, expression: str):
    res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
    if "exceptionDetails" in res:
      raise RuntimeError(f"JavaScript error: {res['exceptionDetails']}")
    return res["result"].get("value")

  def click(self, selector: str) -> None:
    """Real mouse events (move, press, release) at the centre of the first match."""
    box = self.evaluate(
        f"(function(){{var e=document.querySelector({json.dumps(selector)});"
        "if(!e){return null;} e.scrollIntoView({block:'center'});"
        "var r=e.getBoundingClientRect(); return [r.left+r.width/2, r.top+r.height/2];})()")
    if box is None:
      raise LookupError(f"no element matches {selector!r}")
    x, y = box
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
      self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

  def hover(self, selector: str) -> None:
    box = self.evaluate(
        f"(function(){{var r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
        "return [r.left+r.width/2, r.top+r.height/2];})()")
    self.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])

  def problems(self) -> list[str]:
    """Console errors and warnings, log errors and uncaught exceptions seen so far."""
    self.call("Runtime.evaluate", expression="0")  # drain pending events
    out = []
    for e in self.events:
      p = e.get("params", {})
      if e["method"] == "Runtime.exceptionThrown":
        out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
      elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
        out.append(f"console.{p['type']}: " + json.dumps(p.get("args"))[:500])
      elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        out.append("log: " + p["entry"].get("text", "")[:500])
    return out

  def screenshot(self, path, *, selector: str | None = None, pad: int = 8) -> Path:
    params = {"format": "png"}
    if selector:
      box = self.evaluate(
          f"(function(){{var r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
          "return [r.left+window.scrollX, r.top+window.scrollY, r.width, r.height];})()")
      params["clip"] = {"x": max(0, box[0] - pad), "y": max(0, box[1] - pad),
                        "width": box[2] + 2 * pad, "height": box[3] + 2 * pad, "scale": 1}
      params["captureBeyondViewport"] = True
    data = self.call("Page.captureScreenshot", **params)["data"]
    path = Path(path)
    path.write_bytes(base64.b64decode(data))
    return path

  def close(self) -> None:
    try:
      self.ws.close()
    finally:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
      shutil.rmtree(self.profile, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
