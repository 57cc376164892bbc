// A stompjs producer and a stompjs consumer over WebSocket, through a failover of the pair
// (tests/ha/test_websocket_failover.py drives it; tests/support/jsclient.py runs it).
//
// Argument: JSON {urls: [primary, backup], queue, login, passcode ("": anonymous), before,
// after, window, timeout_ms}.
// Both clients use stompjs' own reconnect; `beforeConnect` moves brokerURL to the other
// server at each attempt, so a client whose server died (or that a PASSIVE server refused
// with an ERROR) tries the other one next.
//
// The producer sends persistent messages with a `dup-id` and a receipt, `window` at most
// unreceipted; after a reconnect it sends every unreceipted one again with the same dup-id
// (the server drops what it already has). The consumer acks each message (ack
// client-individual) with a receipt; it is done once every receipted message came and
// the ACKs of its current connection are receipted.
//
// Prints one JSON object a line on stdout: {event: "kill"} once `before` sends are
// receipted (the test kills the active server then), and at the end {event: "done", ...}:
// what was receipted, every delivery (with whether that message's ACK had already been
// receipted: a receipted ACK must never be followed by a delivery of the same message),
// the URLs each client connected to, and the ERRORs received.
"use strict";

const { Client } = require("@stomp/stompjs");
const WebSocket = require("ws");

const cfg = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

function makeClient(name, onConnect) {
  let attempt = -1;
  const client = new Client({
    brokerURL: cfg.urls[0],
    // Node 20 has no global WebSocket: the `ws` package, with stompjs' subprotocols
    webSocketFactory: () => new WebSocket(client.brokerURL, client.stompVersions.protocolVersions()),
    connectHeaders: cfg.login ? { login: cfg.login, passcode: cfg.passcode } : {},
    reconnectDelay: 50,
    heartbeatIncoming: 2000,
    heartbeatOutgoing: 2000,
    beforeConnect: (c) => {
      attempt += 1;
      c.brokerURL = cfg.urls[attempt % cfg.urls.length];
    },
    onConnect: (frame) => {
      report.connects[name].push(client.brokerURL);
      onConnect(frame);
    },
    onStompError: (frame) => {
      report.errors.push({ client: name, url: client.brokerURL, message: frame.headers.message,
                           "active-server": frame.headers["active-server"] || null });
    },
    debug: () => {},
  });
  return client;
}

const report = {
  event: "done",
  receipted: [],
  deliveries: [],
  connects: { producer: [], consumer: [] },
  errors: [],
  resent: 0,
};

// ------------------------------------------------------------ producer

const pending = new Map(); // dup-id -> body, sent (maybe) but not receipted
let next = 0; // the next new message
let killAsked = false;
let receiptedAfterKill = 0;
let receiptSeq = 0;
let producer;

function publish(dupId) {
  const receipt = `p-${++receiptSeq}`;
  const connection = report.connects.producer.length;
  producer.watchForReceipt(receipt, () => {
    if (!pending.has(dupId)) return; // receipted already (sent again meanwhile)
    pending.delete(dupId);
    report.receipted.push(dupId);
    if (killAsked && connection > 1) receiptedAfterKill += 1;
    if (!killAsked && report.receipted.length >= cfg.before) {
      killAsked = true;
      out({ event: "kill" });
    }
    fill();
  });
  producer.publish({
    destination: cfg.queue,
    body: `body of ${dupId}`,
    headers: { receipt, "dup-id": dupId, persistent: "true" },
  });
}

function producing() {
  return !(killAsked && receiptedAfterKill >= cfg.after);
}

function fill() {
  if (!producer.connected) return;
  while (producing() && pending.size < cfg.window) {
    const dupId = `m-${next++}`;
    pending.set(dupId, true);
    publish(dupId);
  }
  if (!producing() && pending.size === 0) finishProducer();
}

producer = makeClient("producer", () => {
  for (const dupId of pending.keys()) { // unreceipted: sent again, same dup-id
    report.resent += 1;
    publish(dupId);
  }
  fill();
});

let producerDone = false;
function finishProducer() {
  if (producerDone) return;
  producerDone = true;
  void producer.deactivate();
  maybeDone();
}

// ------------------------------------------------------------ consumer

const ackReceipted = new Set(); // messages whose ACK was receipted
const delivered = new Set();
let acksWaiting = new Set(); // receipts of ACKs sent on the current connection
let consumer;

consumer = makeClient("consumer", () => {
  acksWaiting = new Set(); // those of a dead connection never come (the ACK may have
  // taken effect all the same: its message then does not come again)
  consumer.subscribe(cfg.queue, (message) => {
    const dupId = message.headers["dup-id"];
    report.deliveries.push([dupId, ackReceipted.has(dupId)]);
    delivered.add(dupId);
    const receipt = `a-${++receiptSeq}`;
    const waiting = acksWaiting;
    waiting.add(receipt);
    consumer.watchForReceipt(receipt, () => {
      ackReceipted.add(dupId);
      waiting.delete(receipt);
      maybeDone();
    });
    message.ack({ receipt });
  }, { ack: "client-individual" });
});

let finished = false;
function maybeDone() {
  if (finished || !producerDone || acksWaiting.size) return;
  if (!report.receipted.every((dupId) => delivered.has(dupId))) return;
  finished = true;
  out(report);
  void consumer.deactivate().then(() => process.exit(0));
}

setTimeout(() => {
  out({ ...report, event: "timeout", pending: [...pending.keys()],
        undelivered: report.receipted.filter((d) => !delivered.has(d)),
        acksWaiting: acksWaiting.size });
  process.exit(2);
}, cfg.timeout_ms || 45000);

producer.activate();
consumer.activate();
