// stompjs over WebSocket to one server (tests/integration/test_websocket.py): subscribe,
// send `count` text messages with receipts and one binary body of every byte value, and
// print what came back as one JSON line: {bodies, binary, receipts}.
//
// Argument: JSON {url, login, passcode, queue, count}.
"use strict";

const { Client } = require("@stomp/stompjs");
const WebSocket = require("ws");

const cfg = JSON.parse(process.argv[2]);
const result = { bodies: [], binary: null, receipts: 0 };

const client = new Client({
  brokerURL: cfg.url,
  webSocketFactory: () => new WebSocket(cfg.url, client.stompVersions.protocolVersions()),
  connectHeaders: { login: cfg.login, passcode: cfg.passcode },
  reconnectDelay: 0, // one connection: anything else is a failure
  debug: () => {},
  onStompError: (frame) => fail(`ERROR ${frame.headers.message}`),
  onWebSocketClose: () => { if (!done) fail("the WebSocket closed"); },
  onConnect: () => {
    client.subscribe(cfg.queue, (message) => {
      if (message.headers["content-type"] === "application/octet-stream") {
        result.binary = Array.from(message.binaryBody);
      } else {
        result.bodies.push(message.body);
      }
      finish();
    });
    for (let i = 0; i < cfg.count; i++) {
      const receipt = `r-${i}`;
      client.watchForReceipt(receipt, () => { result.receipts += 1; finish(); });
      client.publish({ destination: cfg.queue, body: `message ${i} \u2713`,
                       headers: { receipt } });
    }
    const bytes = new Uint8Array(256).map((_, i) => i);
    client.publish({ destination: cfg.queue, binaryBody: bytes,
                     headers: { "content-type": "application/octet-stream" } });
  },
});

let done = false;
function finish() {
  if (done || result.receipts < cfg.count || result.bodies.length < cfg.count
      || result.binary === null) return;
  done = true;
  process.stdout.write(JSON.stringify(result) + "\n");
  void client.deactivate().then(() => process.exit(0));
}

function fail(why) {
  process.stderr.write(why + "\n");
  process.exit(1);
}

setTimeout(() => fail(`timed out: ${JSON.stringify(result)}`), 30000);
client.activate();
