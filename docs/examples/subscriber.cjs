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
// Each push is printed as one JSON line; a push that does not verify is answered 401.
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
  console.log(JSON.stringify(record));
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
    const event = HTTP.toEvent({ headers: request.headers, body });
    answer(response, 204, {
      verified: true,
      id: event.id, // de-duplicate on it: delivery is at least once
      type: event.type, // the destination
      source: event.source,
      // the SDK hands ce- values over as sent: percent-encoded (CloudEvents HTTP binding)
      bizid: event.bizid === undefined ? null : decodeURIComponent(event.bizid),
      traceparent: event.traceparent ?? null,
      attempt: event.attempt ?? null,
      datacontenttype: event.datacontenttype ?? null,
      size: body.length,
    });
  });
});

const port = Number(process.argv[2] ?? 8000);
server.listen(port, "127.0.0.1", () => console.log(JSON.stringify({ listening: port })));
