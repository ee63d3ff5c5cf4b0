package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// clEtcd is a 3-member etcd cluster on loopback (one process per member,
// each with its own data dir, default settings: the WAL is fsynced before
// a write is acknowledged) and a client of all members.
type clEtcd struct {
	members []*clProc
	cli     *clientv3.Client
}

func clStartEtcd(ctx context.Context, procs *clProcs, dir string, n int) (*clEtcd, error) {
	addrs, err := clFreeAddrs(2 * n)
	if err != nil {
		return nil, err
	}
	clientURL := func(i int) string { return "http://" + addrs[2*i] }
	peerURL := func(i int) string { return "http://" + addrs[2*i+1] }
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("e%d=%s", i, peerURL(i)))
	}
	e := &clEtcd{}
	token := fmt.Sprintf("tabula-bench-%d", time.Now().UnixNano()) // one per cluster
	var eps []string
	for i := range n {
		p, err := procs.start(fmt.Sprintf("etcd-%d", i), "etcd",
			"--name", fmt.Sprintf("e%d", i),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("etcd-%d", i)),
			"--listen-client-urls", clientURL(i),
			"--advertise-client-urls", clientURL(i),
			"--listen-peer-urls", peerURL(i),
			"--initial-advertise-peer-urls", peerURL(i),
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", token,
			"--initial-cluster-state", "new",
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
		)
		if err != nil {
			return nil, err
		}
		e.members = append(e.members, p)
		eps = append(eps, clientURL(i))
	}
	e.cli, err = clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	err = clPoll(ctx, 30*time.Second, 100*time.Millisecond, func() (bool, error) {
		for _, m := range e.members {
			if !m.running() {
				return false, fmt.Errorf("%w: %s exited; log tail:\n%s", errStopPolling, m.name, m.tail(20))
			}
		}
		for _, ep := range eps {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := e.cli.Status(sctx, ep)
			cancel()
			if err != nil {
				return false, err
			}
			if st.Leader == 0 {
				return false, fmt.Errorf("%s has no leader yet", ep)
			}
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := e.cli.Put(pctx, "bench-ready", "1")
		return err == nil, err
	}, "the etcd cluster to elect a leader and take a write")
	if err != nil {
		return nil, errors.Join(err, e.cli.Close())
	}
	return e, nil
}

func (e *clEtcd) close() error { return e.cli.Close() }

// clRedis is one redis-server with appendonly yes, appendfsync always
// (every write is fsynced to the AOF before the reply) and no RDB
// snapshots, and a client whose pool fits the suite's goroutines.
type clRedis struct {
	proc *clProc
	cli  *redis.Client
}

func clStartRedis(ctx context.Context, procs *clProcs, dir string, poolSize int) (*clRedis, error) {
	addrs, err := clFreeAddrs(1)
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addrs[0], ":")
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return nil, err
	}
	p, err := procs.start("redis", "redis-server",
		"--port", port, "--bind", "127.0.0.1", "--dir", rdir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--protected-mode", "no")
	if err != nil {
		return nil, err
	}
	r := redis.NewClient(&redis.Options{Addr: addrs[0], PoolSize: poolSize, MinIdleConns: poolSize, DisableIdentity: true})
	err = clPoll(ctx, 20*time.Second, 50*time.Millisecond, func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("%w: redis exited; log tail:\n%s", errStopPolling, p.tail(20))
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := r.Ping(pctx).Err()
		return err == nil, err
	}, "redis to answer PING")
	if err != nil {
		return nil, errors.Join(err, r.Close())
	}
	// Check the durability settings took.
	cfg, err := r.ConfigGet(ctx, "appendfsync").Result()
	if err != nil {
		return nil, errors.Join(err, r.Close())
	}
	if cfg["appendfsync"] != "always" {
		return nil, errors.Join(fmt.Errorf("redis appendfsync is %q, want always", cfg["appendfsync"]), r.Close())
	}
	return &clRedis{proc: p, cli: r}, nil
}

func (r *clRedis) close() error { return r.cli.Close() }
