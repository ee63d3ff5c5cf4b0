package compat

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestJavaScriptSDK runs the Azure SDK for JavaScript (@azure/data-tables,
// the version js/package.json pins) through js/smoke.mjs against the
// target: a second SDK family, whose requests (headers, batch bodies,
// continuation) differ from the Go SDK's. npm installs it into
// compat/js/node_modules when missing; Node.js and npm come with the
// machine (Debian: nodejs, npm).
func TestJavaScriptSDK(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: the JavaScript SDK check needs Node.js and npm (Debian: apt-get install nodejs npm)", tool)
		}
	}
	js, err := filepath.Abs("js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(js, "node_modules", "@azure", "data-tables", "package.json")); err != nil {
		t.Logf("installing the JavaScript SDK into %s", filepath.Join(js, "node_modules"))
		npm := exec.CommandContext(ctx, "npm", "install", "--prefix", js, "--no-audit", "--no-fund", "--no-package-lock")
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm install: %v\n%s", err, out)
		}
	}
	node := exec.CommandContext(ctx, "node", filepath.Join(js, "smoke.mjs"), target.endpoint, target.account, target.key, target.runID)
	out, err := node.CombinedOutput()
	if err != nil {
		t.Fatalf("node js/smoke.mjs against %s: %v\n%s", target.endpoint, err, out)
	}
	t.Logf("%s", out)
}
