#!/usr/bin/env node
// A client of the runtime-env agent in Node.js, written from proto/rtenv/v1/agent.proto alone:
// create an env, print its context, read GetRuntimeEnvsInfo, delete it.
//
//   node client.js --address unix:/path/agent.sock --env '{"working_dir": "..."}' [--token-file F]
//
// Prints one JSON object: {"created": ..., "info": ..., "remaining": N, "after": ...}.
"use strict";

const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO = path.join(__dirname, "..", "..", "proto", "rtenv", "v1", "agent.proto");

function parseArgs(argv) {
  const args = { address: "", env: "", tokenFile: "", timeoutMs: 60000 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === "--address") args.address = value;
    else if (flag === "--env") args.env = value;
    else if (flag === "--token-file") args.tokenFile = value;
    else if (flag === "--timeout-ms") args.timeoutMs = Number(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (!args.address || !args.env) throw new Error("--address and --env are required");
  return args;
}

function loadStub(address) {
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const rtenv = grpc.loadPackageDefinition(definition).rtenv.v1;
  return new rtenv.RuntimeEnvAgent(address, grpc.credentials.createInsecure());
}

// Call a unary method as a promise, with a deadline, a request id and the token if any.
function call(stub, method, request, args) {
  const metadata = new grpc.Metadata();
  if (args.tokenFile) {
    const token = fs.readFileSync(args.tokenFile, "utf8").trim();
    metadata.set("authorization", `Bearer ${token}`);
  }
  const deadline = new Date(Date.now() + args.timeoutMs);
  return new Promise((resolve, reject) => {
    stub[method](request, metadata, { deadline }, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const stub = loadStub(args.address);
  try {
    const created = await call(stub, "CreateRuntimeEnv", {
      serialized_runtime_env: args.env,
      request_id: `node-create-${crypto.randomUUID()}`,
    }, args);
    const info = await call(stub, "GetRuntimeEnvsInfo", { limit: 0 }, args);
    const deleted = await call(stub, "DeleteRuntimeEnv", {
      runtime_env_id: created.runtime_env_id,
      request_id: `node-delete-${crypto.randomUUID()}`,
    }, args);
    const after = await call(stub, "GetRuntimeEnvsInfo", { limit: 0 }, args);
    process.stdout.write(JSON.stringify({
      created, info, remaining: deleted.remaining_references, after,
    }) + "\n");
  } catch (err) {
    const code = err.code !== undefined ? grpc.status[err.code] : "ERROR";
    process.stderr.write(`rtenv node client: ${code}: ${err.details || err.message}\n`);
    process.exitCode = 1;
  } finally {
    stub.close();
  }
}

main();
