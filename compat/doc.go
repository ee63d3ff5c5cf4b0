// Package compat is Tabula's Azure Table conformance suite: it drives the
// Azure SDK for Go (github.com/Azure/azure-sdk-for-go/sdk/data/aztables)
// through every operation of the Azure Table REST surface against an
// endpoint and checks the service's answers: status codes, error codes,
// ETags, Edm types, queries and continuation, entity group transactions,
// limits, Shared Key and SAS. TestJavaScriptSDK also runs the Azure SDK
// for JavaScript (@azure/data-tables, pinned in js/package.json and
// installed by npm into js/node_modules when missing) through js/smoke.mjs:
// tables, entity operations with ETags and Edm types, batches, filtered
// and paged queries.
//
// It is its own Go module, as bench/ is, so the Azure SDK never enters the
// product's go.mod. The package holds tests only:
//
//	cd compat && go test ./...
//
// The endpoint under test:
//
//   - TABULA_COMPAT_ENDPOINT set: that endpoint, as a connection string
//     (DefaultEndpointsProtocol=http;AccountName=...;AccountKey=...;
//     TableEndpoint=http://host:port/account;) or as a table endpoint URL
//     (http://127.0.0.1:10002/devstoreaccount1) with the account and key in
//     TABULA_COMPAT_ACCOUNT and TABULA_COMPAT_KEY (default: the well-known
//     development account devstoreaccount1 and its published key).
//     TABULA_COMPAT_TARGET then says what is behind it (azurite skips the
//     checks where Azurite is known to deviate from the service).
//   - TABULA_COMPAT_TARGET=tabula (the default): the suite builds
//     ../cmd/tabula into a temp dir, runs `tabula dev --data <tmp>
//     --listen 127.0.0.1:<free> --azure-listen 127.0.0.1:<free>` and waits
//     for the gateway; it kills the process group at the end.
//     TABULA_COMPAT_TABULA_BIN names a tabula binary to run instead of
//     building one.
//   - TABULA_COMPAT_TARGET=azurite: the suite installs the npm package
//     azurite into compat/.azurite when it is missing (npm install --prefix
//     .azurite azurite) and runs azurite-table --inMemoryPersistence on a
//     free port: the reference emulator, to check the suite itself.
//
// Where Azurite deviates from the service (cross-partition batches, more
// than 252 properties, entities over 1 MiB), the tests assert the
// service's behaviour and skip on Azurite, saying why.
package compat
