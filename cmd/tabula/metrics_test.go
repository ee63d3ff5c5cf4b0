package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// scrapeMetrics fetches and parses a /metrics page.
func scrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sample is the value of family name's sample whose labels include want
// (0, false without one).
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
metric:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue metric
			}
		}
		if m.Counter != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// TestMetricsAndJSONLogsMultiProcess runs `tabula master` and `tabula
// server` with --metrics-listen and --log-format json, writes and reads
// through the SDK, and checks each process's /metrics and that every log
// line is a JSON object.
func TestMetricsAndJSONLogsMultiProcess(t *testing.T) {
	dir := t.TempDir()
	masterAddr, masterMetrics, serverMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	master := start(t, "master", append([]string{"--log-format", "json", "master", "--listen", masterAddr,
		"--data", filepath.Join(dir, "master"), "--metrics-listen", masterMetrics}, fastTiming...)...)
	master.waitOutput(`"msg":"master serving"`, 15*time.Second)
	server := start(t, "server", "--log-format", "json", "server", "--master", masterAddr,
		"--data", filepath.Join(dir, "server"), "--metrics-listen", serverMetrics)
	server.waitOutput(`"msg":"table server listening"`, 15*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}, RetryTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 15*time.Second, "a live server", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		return len(ss) == 1 && ss[0].GetAlive(), err
	})
	if _, err := c.CreateTable(ctx, "m", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 2, Storage: "memory", Replication: 1}); err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("m")
	const n = 10
	for i := range n {
		if err := tbl.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := tbl.Get(ctx, fmt.Appendf(nil, "k%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	sf, err := scrapeMetrics("http://" + serverMetrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// Every Put and Get succeeded once; the SDK may have retried some
	// (a partition's primary still starting): those count as errors.
	for _, op := range []string{"TableServer/Put", "TableServer/Get"} {
		labels := map[string]string{"tenant": api.DefaultTenant, "table": "m", "op": op}
		reqs, _ := sample(sf, "tabula_rpc_requests_total", labels)
		var errs float64
		for _, m := range sf["tabula_rpc_errors_total"].GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["tenant"] == labels["tenant"] && got["table"] == labels["table"] && got["op"] == op {
				errs += m.GetCounter().GetValue()
			}
		}
		if reqs-errs != n {
			t.Errorf("server: %s requests %v - errors %v = %v, want %d", op, reqs, errs, reqs-errs, n)
		}
	}
	if v, _ := sample(sf, "tabula_engine_keys", nil); v < n {
		t.Errorf("server: engine keys = %v, want >= %d", v, n)
	}
	if v, _ := sample(sf, "tabula_server_partitions", map[string]string{"kind": "point"}); v != 2 {
		t.Errorf("server: partitions = %v, want 2", v)
	}
	mf, err := scrapeMetrics("http://" + masterMetrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := sample(mf, "tabula_rpc_requests_total", map[string]string{"tenant": api.DefaultTenant, "table": "m", "op": "Master/CreateTable"}); v != 1 {
		t.Errorf("master: CreateTable requests = %v, want 1", v)
	}
	if v, _ := sample(mf, "tabula_master_servers", map[string]string{"state": "alive"}); v != 1 {
		t.Errorf("master: alive servers = %v, want 1", v)
	}
	if _, ok := sample(mf, "go_goroutines", nil); !ok {
		t.Error("master: no Go runtime metrics")
	}

	// Every line either process logged is one JSON object with a level
	// and a message.
	for _, p := range []*proc{master, server} {
		ls := lines(p.output())
		if len(ls) == 0 {
			t.Errorf("%s logged nothing", p.name)
		}
		for _, l := range ls {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Errorf("%s: log line is not JSON: %q (%v)", p.name, l, err)
				continue
			}
			if rec["level"] == nil || rec["msg"] == nil {
				t.Errorf("%s: log line lacks level or msg: %q", p.name, l)
			}
		}
	}
}

func TestLogFormatRefusesUnknown(t *testing.T) {
	out, err := exec.Command(tabulaBin, "--log-format", "xml", "master", "--data", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `--log-format "xml": want text or json`) {
		t.Fatalf("--log-format xml: err %v, output %q", err, out)
	}
}

// TestDevMetrics runs `tabula dev --metrics-listen`: it prints the one
// metrics page of its embedded cluster, where each server's figures carry
// its index.
func TestDevMetrics(t *testing.T) {
	dev := start(t, "dev", "dev", "--data", filepath.Join(t.TempDir(), "d"), "--listen", freeAddr(t),
		"--servers", "2", "--metrics-listen", "127.0.0.1:0")
	dev.waitOutput("tabula dev ready", 30*time.Second)
	var url string
	for _, l := range lines(dev.output()) {
		if u, ok := strings.CutPrefix(l, "metrics "); ok {
			url = strings.TrimSpace(u)
		}
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("dev printed no metrics address:\n%s", dev.output())
	}
	fams, err := scrapeMetrics(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"0", "1"} {
		if _, ok := sample(fams, "tabula_stream_extents", map[string]string{"server": s}); !ok {
			t.Errorf("no tabula_stream_extents{server=%q}", s)
		}
	}
	if v, _ := sample(fams, "tabula_master_servers", map[string]string{"state": "alive"}); v != 2 {
		t.Errorf("alive servers = %v, want 2", v)
	}
	if v, _ := sample(fams, "tabula_rpc_requests_total", map[string]string{"op": "Master/RegisterServer"}); v < 2 {
		t.Errorf("RegisterServer requests = %v, want >= 2", v)
	}
}
