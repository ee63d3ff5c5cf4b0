package client_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

func TestZZPerfLatency(t *testing.T) {
	if os.Getenv("ZZPERF") == "" {
		t.Skip()
	}
	reps, _ := strconv.Atoi(os.Getenv("ZZREPL"))
	tc := startCluster(t, 3)
	c := newClient(t, tc.MasterAddr())
	tbl := createTable(t, c, "perf", &api.TableOptions{Partitions: 3, Replication: uint32(reps)})
	ctx := context.Background()
	_ = tbl.Put(ctx, []byte("warm"), []byte("x"))
	time.Sleep(time.Second)
	var lat []time.Duration
	v := make([]byte, 100)
	for i := range 2000 {
		t0 := time.Now()
		if err := tbl.Put(ctx, []byte(fmt.Sprintf("k%d", i)), v); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("replication %d, one writer: p50 %v p99 %v", reps, lat[len(lat)/2], lat[len(lat)*99/100])
}

func TestZZPerfWrites(t *testing.T) {
	if os.Getenv("ZZPERF") == "" {
		t.Skip()
	}
	tc := startCluster(t, 3)
	c := newClient(t, tc.MasterAddr())
	tbl := createTable(t, c, "perf", &api.TableOptions{Partitions: 15, Replication: 3})
	ctx := context.Background()
	_ = tbl.Put(ctx, []byte("warm"), []byte("x"))
	time.Sleep(time.Second)
	done := make(chan int, 16)
	end := time.Now().Add(5 * time.Second)
	v := make([]byte, 100)
	for g := range 16 {
		go func() {
			n := 0
			for i := 0; time.Now().Before(end); i++ {
				if err := tbl.Put(ctx, []byte(fmt.Sprintf("k%d-%d", g, i%5000)), v); err != nil {
					t.Error(err)
					break
				}
				n++
			}
			done <- n
		}()
	}
	total := 0
	for range 16 {
		total += <-done
	}
	t.Logf("%d writes in 5s: %.0f/s", total, float64(total)/5)
}
