#!/usr/bin/env node
// A client of the runtime-env agent in Node.js, written from proto/rtenv/v1/agent.proto alone:
// create an env, print its context, read GetRuntimeEnvsInfo, delete it.
//
//   node client.js --address unix:/path/agent.sock --env '{"working_dir": "..."}' [--token-file F]
//
// Prints one JSON object: {"created": ..., "info": ..., "remaining": N, "after": ...}.
// `node client.js --help` prints the usage; a usage mistake is one line on stderr and exit 2.
"use strict";

const fs = require("fs");
const path = require("path");
const crypto = require("crypto");

const PROTO = path.join(__dirname, "..", "..", "proto", "rtenv", "v1", "agent.proto");
const USAGE = `usage: node client.js --address ADDR --env JSON [--token-file FILE] [--timeout-ms MS]

Creates the runtime env given as JSON on the agent at ADDR (unix:PATH or HOST:PORT), prints its
context and GetRuntimeEnvsInfo, deletes it, and prints one JSON object:
{"created": ..., "info": ..., "remaining": N, "after": ...}.
Exit status: 0 done, 1 the agent answered with an error, 2 bad usage.
`;

// A mistake on the command line: one line and exit 2, never a stack trace.
class UsageError extends Error {}

function parseArgs(argv) {
  const args = { address: "", env: "", tokenFile: "", timeoutMs: 60000, help: false };
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    if (flag === "--help" || flag === "-h") {
      args.help = true;
      return args;
    }
    const value = argv[i + 1];
    const shown = JSON.stringify(flag.slice(0, 40));
    if (!["--address", "--env", "--token-file", "--timeout-ms"].includes(flag)) {
      throw new UsageError(`unknown argument ${shown}`);
    }
    if (value === undefined) throw new UsageError(`${flag} needs a value`);
    if (flag === "--address") args.address = value;
    else if (flag === "--env") args.env = value;
    else if (flag === "--token-file") args.tokenFile = value;
    else {
      args.timeoutMs = Number(value);
      if (!Number.isInteger(args.timeoutMs) || args.timeoutMs <= 0) {
        throw new UsageError(`--timeout-ms must be a positive whole number of milliseconds`);
      }
    }
  }
  if (!args.address || !args.env) throw new UsageError("--address and --env are required");
  return args;
}

function loadStub(grpc, address) {
  const protoLoader = require("@grpc/proto-loader");
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const rtenv = grpc.loadPackageDefinition(definition).rtenv.v1;
  return new rtenv.RuntimeEnvAgent(address, grpc.credentials.createInsecure());
}

// Call a unary method as a promise, with a deadline, a request id and the token if any.
function call(grpc, stub, method, request, args) {
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
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`rtenv node client: ${err.message} (--help for usage)\n`);
    process.exitCode = 2;
    return;
  }
  if (args.help) {
    process.stdout.write(USAGE);
    return;
  }
  // Loaded only now: --help and usage errors work before `npm ci` too.
  const grpc = require("@grpc/grpc-js");
  let stub;
  try {
    stub = loadStub(grpc, args.address);
    const created = await call(grpc, stub, "CreateRuntimeEnv", {
      serialized_runtime_env: args.env,
      request_id: `node-create-${crypto.randomUUID()}`,
    }, args);
    const info = await call(grpc, stub, "GetRuntimeEnvsInfo", { limit: 0 }, args);
    const deleted = await call(grpc, stub, "DeleteRuntimeEnv", {
      runtime_env_id: created.runtime_env_id,
      request_id: `node-delete-${crypto.randomUUID()}`,
    }, args);
    const after = await call(grpc, stub, "GetRuntimeEnvsInfo", { limit: 0 }, args);
    process.stdout.write(JSON.stringify({
      created, info, remaining: deleted.remaining_references, after,
    }) + "\n");
  } catch (err) {
    const code = typeof err.code === "number" ? grpc.status[err.code] : "ERROR";
    process.stderr.write(`rtenv node client: ${code}: ${err.details || err.message}\n`);
    process.exitCode = 1;
  } finally {
    if (stub !== undefined) stub.close();
  }
}

main();
