// A msgbus subscriber outside the bus's code: node:crypto checks each push's signature
// (Standard Webhooks scheme), the CloudEvents SDK reads its attributes.
//
// The signature is checked here by hand, in a few lines, because the `standardwebhooks` npm
// package turns the body into UTF-8 text first, and parses it as JSON: it cannot verify a push
// whose body is bytes of another kind (an image, a protobuf). For JSON bodies it works as well.
//
//   npm install cloudevents
//   MSGBUS_SIGNING_SECRET=whsec_... node subscriber.cjs 8000
//
// Each message is printed as one JSON line (a batch push, application/cloudevents-batch+json,
// one line per message); a push that does not verify is answered 401.
const crypto = require("node:crypto");
const http = require("node:http");
const { HTTP } = require("cloudevents");

const TOLERANCE_S = 300; // refuse pushes signed longer ago than this (or as far ahead): replays

// Throws unless one of the push's signatures is `secret`'s over its raw body. During a secret
// rotation a push carries one signature per secret: either one passes.
function verify(secret, headers, body) {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!id || !timestamp || !headers["webhook-signature"]) throw new Error("not signed");
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > TOLERANCE_S) {
    throw new Error("timestamp too far from now");
  }
  const signed = Buffer.concat([Buffer.from(`${id}.${timestamp}.`), body]);
  const expected = crypto.createHmac("sha256", key).update(signed).digest();
  for (const entry of headers["webhook-signature"].split(" ")) {
    const [version, signature] = entry.split(",", 2);
    const given = Buffer.from(signature ?? "", "base64");
    if (version === "v1" && given.length === expected.length
        && crypto.timingSafeEqual(given, expected)) return;
  }
  throw new Error("no matching signature");
}

function answer(response, status, record) {
  if (record !== null) console.log(JSON.stringify(record));
  response.writeHead(status, { "content-length": "0" });
  response.end();
}

const server = http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const body = Buffer.concat(chunks); // the raw bytes: what the signature covers
    try {
      verify(process.env.MSGBUS_SIGNING_SECRET, request.headers, body);
    } catch (error) {
      return answer(response, 401, { verified: false, error: String(error) });
    }
    // a batch push (application/cloudevents-batch+json) gives an array: one event per message
    const parsed = HTTP.toEvent({ headers: request.headers, body });
    const batch = Array.isArray(parsed) ? request.headers["webhook-id"] : null;
    for (const event of Array.isArray(parsed) ? parsed : [parsed]) {
      console.log(JSON.stringify(record(event, batch, batch ? null : body.length)));
    }
    answer(response, 204, null); // every message of a batch is delivered
  });
});

// `size`: the body's bytes (a single push), else those of the event's data
function record(event, batch, size) {
  const data = event.data_base64 !== undefined ? Buffer.from(event.data_base64, "base64")
    : event.data;
  return {
    verified: true,
    id: event.id, // de-duplicate on it: delivery is at least once
    type: event.type, // the destination
    source: event.source,
    // single pushes: the SDK hands ce- values over as sent, percent-encoded (CloudEvents HTTP
    // binding); in a batch, JSON carries the text as it is
    bizid: event.bizid === undefined ? null : batch ? event.bizid : decodeURIComponent(event.bizid),
    traceparent: event.traceparent ?? null,
    attempt: event.attempt ?? null,
    datacontenttype: event.datacontenttype ?? null,
    size: size ?? (Buffer.isBuffer(data) ? data.length : JSON.stringify(data ?? null).length),
    batch,
  };
}

const port = Number(process.argv[2] ?? 8000);
server.listen(port, "127.0.0.1", () => console.log(JSON.stringify({ listening: port })));
