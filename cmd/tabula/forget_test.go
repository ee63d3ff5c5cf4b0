package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServerForget: a killed server's durable partitions wait for it (the
// deprecated --reassign-durable-after is accepted and does nothing); only
// `tabula server forget ID --accept-data-loss` moves them, saying what was
// lost, and `tabula table describe` keeps showing it.
func TestServerForget(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master"),
		"--reassign-durable-after", "2s"}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	if out := master.output(); !strings.Contains(out, "reassign-durable-after has been deprecated, it does nothing") {
		t.Fatalf("no deprecation notice for --reassign-durable-after:\n%s", out)
	}
	var servers []*proc
	for i := range 2 {
		servers = append(servers, start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)))
	}
	for _, s := range servers {
		s.waitOutput("registered with master", 20*time.Second)
	}
	mustCLI(t, masterAddr, "table", "create", "d", "--partitions", "4", "--storage", "ssd", "--replicas", "1")
	before := mustCLI(t, masterAddr, "table", "describe", "d")
	if strings.Contains(before, "DATA LOST") {
		t.Fatalf("describe of a healthy table:\n%s", before)
	}
	// The id of server-0 from its log line.
	out := servers[0].output()
	i := strings.Index(out, "server_id=")
	if i < 0 {
		t.Fatalf("no server id in server-0's output:\n%s", out)
	}
	id := strings.Fields(out[i+len("server_id="):])[0]
	servers[0].kill()
	waitFor(t, 20*time.Second, "server-0 declared dead", func() (bool, error) {
		return strings.Contains(master.output(), "partitions whose only copy it holds are UNAVAILABLE"), nil
	})

	_, errOut, err := cli(t, masterAddr, nil, "server", "forget", id)
	if err == nil || !strings.Contains(errOut, "--accept-data-loss") || !strings.Contains(errOut, "data_loss_not_accepted") {
		t.Fatalf("forget without --accept-data-loss: %v\n%s", err, errOut)
	}
	out = mustCLI(t, masterAddr, "server", "forget", id, "--accept-data-loss")
	if !strings.Contains(out, "forgot server "+id+": 2 partition(s) moved") || !strings.Contains(out, "DATA LOST: 2 partition(s)") ||
		lostRows(out) != 2 {
		t.Fatalf("forget output:\n%s", out)
	}
	desc := mustCLI(t, masterAddr, "table", "describe", "d")
	if !strings.Contains(desc, "DATA LOST    2 partition(s)") || lostRows(desc) != 2 || strings.Contains(desc, "(down)") {
		t.Fatalf("describe after forget:\n%s", desc)
	}
	// The moved partitions are served again (empty), by the live server.
	for k := range 8 {
		mustCLI(t, masterAddr, "put", "d", fmt.Sprintf("k%d", k), "v")
	}
	// An absent key of a lost partition is DATA_LOSS, never "not found";
	// of the others, not found.
	lostAnswers, notFound := 0, 0
	for k := range 16 {
		_, errOut, err := cli(t, masterAddr, nil, "get", "d", fmt.Sprintf("absent-%d", k))
		switch {
		case err != nil && strings.Contains(errOut, "partition_data_lost"):
			lostAnswers++
		case err != nil && strings.Contains(strings.ToLower(errOut), "not found"):
			notFound++
		default:
			t.Fatalf("get of an absent key: %v\n%s", err, errOut)
		}
	}
	if lostAnswers == 0 || notFound == 0 {
		t.Fatalf("absent keys: %d answered DATA_LOSS, %d not found; want both kinds (2 of 4 partitions lost)", lostAnswers, notFound)
	}

	// The operator acknowledges the loss: absent keys are not found
	// everywhere, what was written since is served, and describe no
	// longer lists the loss. Clearing again finds nothing.
	out = mustCLI(t, masterAddr, "table", "clear-data-loss", "d")
	if !strings.Contains(out, "data loss acknowledged for partition(s)") {
		t.Fatalf("clear-data-loss:\n%s", out)
	}
	waitFor(t, 10*time.Second, "absent keys not found after the loss is cleared", func() (bool, error) {
		for k := range 16 {
			_, errOut, err := cli(t, masterAddr, nil, "get", "d", fmt.Sprintf("absent-%d", k))
			if err == nil || !strings.Contains(strings.ToLower(errOut), "not found") {
				return false, fmt.Errorf("get absent-%d: %v %s", k, err, errOut)
			}
		}
		return true, nil
	})
	for k := range 8 {
		if v := strings.TrimSpace(mustCLI(t, masterAddr, "get", "d", fmt.Sprintf("k%d", k))); v != "v" {
			t.Fatalf("k%d after the loss was cleared: %q", k, v)
		}
	}
	if desc := mustCLI(t, masterAddr, "table", "describe", "d"); strings.Contains(desc, "DATA LOST") {
		t.Fatalf("describe after clear-data-loss:\n%s", desc)
	}
	if out := mustCLI(t, masterAddr, "table", "clear-data-loss", "d"); !strings.Contains(out, "no partition has a data loss") {
		t.Fatalf("clear-data-loss again:\n%s", out)
	}
}

// lostRows counts the rows of a lost-partitions table in out.
func lostRows(out string) int {
	n := 0
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "default/d ") {
			n++
		}
	}
	return n
}
