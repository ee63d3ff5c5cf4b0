package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// chromiumPath finds Debian's chromium (.ci/run installs it). Without it
// the test fails in CI ($CI or $TABULA_CI set) and is skipped elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium is not installed (apt-get install -y chromium): the dashboard test drives the page in headless Chromium"
	if os.Getenv("CI") != "" || os.Getenv("TABULA_CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// renderedPartition is a partition row as the page shows it.
type renderedPartition struct {
	ID      string `json:"id"`
	Primary string `json:"primary"`
	Text    string `json:"text"`
}

// TestDashboardKill9 runs a master with --dashboard-listen and three
// servers, opens the dashboard in headless Chromium, kill -9s a server
// and checks what the page shows: the server dead, its partitions' new
// primaries (the master's map), and the events of its death and the
// failovers.
func TestDashboardKill9(t *testing.T) {
	chromium := chromiumPath(t)
	dir := t.TempDir()
	masterAddr, dashAddr := freeAddr(t), freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master"),
		"--dashboard-listen", dashAddr}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	if out := master.output(); !strings.Contains(out, "http://"+dashAddr+"/") {
		t.Fatalf("master does not log its dashboard's address:\n%s", out)
	}
	servers := map[string]*proc{} // by fault domain
	for i := range 3 {
		fd := fmt.Sprintf("fd-%d", i)
		servers[fd] = start(t, "server-"+fd, "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fd), "--fault-domain", fd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fdOf := map[string]string{} // server id -> fault domain
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		for _, s := range ss {
			if s.GetAlive() {
				fdOf[s.GetId()] = s.GetFaultDomain()
			}
		}
		return len(fdOf) == 3, err
	})
	pm, err := c.CreateTable(ctx, "dash", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 6, Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := c.Table("dash").Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// The victim is the primary of the first partition.
	victim := primaryID(pm.GetPartitions()[0])
	var wasPrimary []uint64
	for _, p := range pm.GetPartitions() {
		if primaryID(p) == victim {
			wasPrimary = append(wasPrimary, p.GetId())
		}
	}

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(filepath.Join(dir, "chromium")))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.Navigate("http://"+dashAddr+"/")); err != nil {
		t.Fatalf("open the dashboard in chromium: %v", err)
	}
	// serverState is the state the page shows in the victim's row (its
	// data-state, and the row's visible text).
	serverRow := fmt.Sprintf(`(() => { const r = document.querySelector('tr[data-server=%q]'); return r ? r.dataset.state + "|" + r.innerText : ""; })()`, victim)
	waitFor(t, 15*time.Second, "the page to show the victim alive and the table", func() (bool, error) {
		row, err := chromedp.Run(browser, chromedp.Evaluate[string](serverRow))
		if err != nil {
			return false, err
		}
		parts, err := chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll('details[data-table="default/dash"] tr[data-partition]').length`))
		if err != nil {
			return false, err
		}
		return strings.HasPrefix(row, "alive|") && strings.Contains(row, "alive") && parts == 6, fmt.Errorf("row %q, %d partitions", row, parts)
	})

	// The Load section renders (this table is not replicated by a log:
	// it has no load view, and nothing moves).
	load, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.getElementById("elastic-section").innerText`))
	if err != nil || !strings.Contains(load, "No move or split under way") {
		t.Fatalf("the Load section: %q (%v)", load, err)
	}

	servers[fdOf[victim]].kill() // SIGKILL

	// The page shows it dead (no reload: it updates itself).
	waitFor(t, 15*time.Second, "the page to show the killed server dead", func() (bool, error) {
		row, err := chromedp.Run(browser, chromedp.Evaluate[string](serverRow))
		return strings.HasPrefix(row, "dead|") && strings.Contains(row, "dead"), fmt.Errorf("row %q (%v)", row, err)
	})
	// Its partitions have new primaries there, the master's, and the
	// events say what happened.
	var rendered []renderedPartition
	var events string
	waitFor(t, 15*time.Second, "new primaries and events on the page", func() (bool, error) {
		var err error
		rendered, err = chromedp.Run(browser, chromedp.Evaluate[[]renderedPartition](`Array.from(document.querySelectorAll('details[data-table="default/dash"] tr[data-partition]')).map(r => ({id: r.dataset.partition, primary: r.dataset.primary, text: r.innerText}))`))
		if err != nil {
			return false, err
		}
		events, err = chromedp.Run(browser, chromedp.Evaluate[string](`document.getElementById("events").innerText`))
		if err != nil {
			return false, err
		}
		if !strings.Contains(events, "server "+victim+" declared dead") {
			return false, fmt.Errorf("events: %q", events)
		}
		for _, r := range rendered {
			if r.Primary == "" || r.Primary == victim {
				return false, fmt.Errorf("partition %s primary %q", r.ID, r.Primary)
			}
		}
		return true, nil
	})
	desc, err := c.DescribeTable(ctx, "dash")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]renderedPartition{}
	for _, r := range rendered {
		byID[r.ID] = r
	}
	for _, p := range desc.GetMap().GetPartitions() {
		r, ok := byID[fmt.Sprint(p.GetId())]
		if !ok {
			t.Fatalf("partition %d not on the page: %+v", p.GetId(), rendered)
		}
		if r.Primary != primaryID(p) || !strings.Contains(r.Text, primaryID(p)+" primary") {
			t.Fatalf("partition %d: page shows primary %q (%q), the master's map %q", p.GetId(), r.Primary, r.Text, primaryID(p))
		}
		for _, rep := range p.GetReplicas() {
			if rep.GetServerId() == victim && !strings.Contains(r.Text, victim+" secondary (server dead)") {
				t.Fatalf("partition %d keeps a replica on %s, which the page does not show dead: %q", p.GetId(), victim, r.Text)
			}
		}
	}
	for _, id := range wasPrimary {
		r := byID[fmt.Sprint(id)]
		if want := "primary " + victim + " -> " + r.Primary; !strings.Contains(events, want) {
			t.Fatalf("no failover event %q for partition %d in:\n%s", want, id, events)
		}
	}
	if !strings.Contains(events, "server dead") || !strings.Contains(events, "failover") {
		t.Fatalf("events do not name their kinds:\n%s", events)
	}
}

// TestDevDashboard runs `tabula dev` with a raft group: it prints the
// dashboard's address, and the page follows the leading member.
func TestDevDashboard(t *testing.T) {
	dev := start(t, "dev", "dev", "--data", filepath.Join(t.TempDir(), "d"), "--listen", freeAddr(t), "--servers", "2", "--masters", "3")
	dev.waitOutput("tabula dev ready", 30*time.Second)
	var url string
	for _, l := range lines(dev.output()) {
		if u, ok := strings.CutPrefix(l, "dashboard "); ok {
			url = strings.TrimSpace(u)
		}
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/") {
		t.Fatalf("dev printed no dashboard address:\n%s", dev.output())
	}
	var snap struct {
		Master struct {
			Leads bool   `json:"leads"`
			Raft  bool   `json:"raft"`
			Note  string `json:"note"`
		} `json:"master"`
		FaultDomains []struct {
			Servers []struct {
				State string `json:"state"`
			} `json:"servers"`
		} `json:"fault_domains"`
	}
	waitFor(t, 20*time.Second, "the leader's dashboard with 2 live servers", func() (bool, error) {
		resp, err := http.Get(url + "api/cluster")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
			return false, err
		}
		alive := 0
		for _, fd := range snap.FaultDomains {
			for _, s := range fd.Servers {
				if s.State == "alive" {
					alive++
				}
			}
		}
		return snap.Master.Raft && snap.Master.Leads && snap.Master.Note == "" && alive == 2, fmt.Errorf("snapshot %+v", snap)
	})
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET %s: %s %v", url, resp.Status, resp.Header)
	}
}
