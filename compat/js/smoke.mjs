// The Azure SDK for JavaScript (@azure/data-tables) through the operations
// a user meets first: tables, every entity operation with ETags, typed
// properties, a batch that applies and one that fails whole, a filtered
// query and a paged one. Run by compat's TestJavaScriptSDK:
//
//	node smoke.mjs ENDPOINT ACCOUNT KEY RUNID
//
// It exits 1 after printing FAIL lines when anything differs from the
// service's behaviour.
import { TableClient, TableServiceClient, AzureNamedKeyCredential, odata, TableTransaction } from "@azure/data-tables";

const [url, account, key, runID] = process.argv.slice(2);
const cred = new AzureNamedKeyCredential(account, key);
const opts = { allowInsecureConnection: true };
const svc = new TableServiceClient(url, cred, opts);
const name = "jssdk" + runID;
const fail = (m) => { console.error("FAIL", m); process.exitCode = 1; };
const expectStatus = async (what, status, fn) => {
  try {
    await fn();
    fail(`${what}: succeeded, want HTTP ${status}`);
  } catch (err) {
    if (err.statusCode !== status) fail(`${what}: ${err.statusCode} ${err.message}, want HTTP ${status}`);
  }
};

await svc.createTable(name);
const t = new TableClient(url, name, cred, opts);
const when = new Date("2024-01-02T03:04:05.678Z");
await t.createEntity({
  partitionKey: "p1", rowKey: "r1", s: "hello", n: 42, b: true, f: 1.5, d: when,
  big: { value: "9007199254740993", type: "Int64" },
  g: { value: "0f8fad5b-d9cb-469f-a165-70867728950e", type: "Guid" },
  bin: new Uint8Array([1, 2, 3]),
});
const got = await t.getEntity("p1", "r1", { disableTypeConversion: false });
if (got.s !== "hello" || got.n !== 42 || got.b !== true || got.f !== 1.5) fail(`get: ${got.s} ${got.n} ${got.b} ${got.f}`);
if (new Date(got.d).getTime() !== when.getTime()) fail(`DateTime: ${got.d}`);
if (String(got.big?.value ?? got.big) !== "9007199254740993") fail(`Int64: ${got.big}`);
if (!got.bin || Array.from(got.bin).join(",") !== "1,2,3") fail(`Binary: ${got.bin}`);
if (!got.etag || !got.timestamp) fail("no etag or timestamp");

await t.updateEntity({ partitionKey: "p1", rowKey: "r1", s: "merged" }, "Merge", { etag: got.etag });
await expectStatus("replace with a stale etag", 412, () => t.updateEntity({ partitionKey: "p1", rowKey: "r1" }, "Replace", { etag: got.etag }));
await expectStatus("insert of an existing entity", 409, () => t.createEntity({ partitionKey: "p1", rowKey: "r1" }));
const merged = await t.getEntity("p1", "r1");
if (merged.s !== "merged" || merged.n !== 42) fail(`merge kept ${merged.s} ${merged.n}`);
await t.upsertEntity({ partitionKey: "p1", rowKey: "r2", s: "two" }, "Replace");
await t.upsertEntity({ partitionKey: "p1", rowKey: "r2", x: 1 }, "Merge");
const up = await t.getEntity("p1", "r2");
if (up.s !== "two" || up.x !== 1) fail(`upserts: ${up.s} ${up.x}`);

const tx = new TableTransaction();
for (let i = 0; i < 5; i++) tx.createEntity({ partitionKey: "p2", rowKey: "b" + i, i });
const res = await t.submitTransaction(tx.actions);
if (res.status !== 202 || res.subResponses.length !== 5) fail(`batch: ${res.status}, ${res.subResponses.length} answers`);
const bad = new TableTransaction();
bad.createEntity({ partitionKey: "p2", rowKey: "b9" });
bad.createEntity({ partitionKey: "p2", rowKey: "b0" });
await expectStatus("a batch inserting an existing entity", 409, () => t.submitTransaction(bad.actions));
await expectStatus("get of an insert of a failed batch", 404, () => t.getEntity("p2", "b9"));

let n = 0;
for await (const e of t.listEntities({ queryOptions: { filter: odata`PartitionKey eq ${"p2"} and i ge ${2}` } })) {
  if (e.i < 2) fail(`filter returned i=${e.i}`);
  n++;
}
if (n !== 3) fail(`filtered query: ${n} entities, want 3`);
let pages = 0, rows = 0;
for await (const page of t.listEntities({ queryOptions: { select: ["i"] } }).byPage({ maxPageSize: 2 })) {
  pages++;
  rows += page.length;
}
if (rows !== 7 || pages !== 4) fail(`paged query: ${rows} rows in ${pages} pages, want 7 in 4`);

await t.deleteEntity("p1", "r2");
await expectStatus("get of a deleted entity", 404, () => t.getEntity("p1", "r2"));
let tables = 0;
for await (const x of svc.listTables({ queryOptions: { filter: odata`TableName eq ${name}` } })) tables++;
if (tables !== 1) fail(`listTables: ${tables}, want 1`);
await svc.deleteTable(name);
await expectStatus("get from a deleted table", 404, () => t.getEntity("p1", "r1"));
console.log(process.exitCode ? "javascript sdk: FAILED" : "javascript sdk: ok");
