package coproc

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logLimiter is a token bucket over one module key's log lines (log, stdout
// and stderr together): LogRate lines a second, bursts of LogBurst. A
// guest that logs in a loop costs the server a counter increment per line,
// not a log write.
type logLimiter struct {
	rt     *Runtime
	logger *slog.Logger

	mu struct {
		sync.Mutex
		// Guarded by mu.
		tokens  float64
		last    time.Time
		dropped uint64
	}
}

func newLogLimiter(r *Runtime, key ModuleKey) *logLimiter {
	l := &logLimiter{rt: r}
	l.logger = r.opts.Logger.With(
		slog.String("coproc_tenant", key.Tenant), slog.String("coproc_table", key.Table),
		slog.String("coproc_module", key.Name), slog.Uint64("coproc_version", key.Version))
	l.mu.tokens = float64(r.opts.LogBurst)
	return l
}

// allow takes a token; it reports how many lines were dropped since the
// last allowed one.
func (l *logLimiter) allow() (ok bool, dropped uint64) {
	now := l.rt.opts.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mu.last.IsZero() {
		l.mu.tokens += now.Sub(l.mu.last).Seconds() * l.rt.opts.LogRate
		if max := float64(l.rt.opts.LogBurst); l.mu.tokens > max {
			l.mu.tokens = max
		}
	}
	l.mu.last = now
	if l.mu.tokens < 1 {
		l.mu.dropped++
		l.rt.stats.logDropped.Add(1)
		return false, 0
	}
	l.mu.tokens--
	dropped, l.mu.dropped = l.mu.dropped, 0
	return true, dropped
}

// maxLogLine bounds one logged line; the rest is cut.
const maxLogLine = 1024

func (l *logLimiter) log(level slog.Level, source string, st *callState, msg string) {
	ok, dropped := l.allow()
	if !ok {
		return
	}
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "…"
	}
	attrs := []slog.Attr{slog.String("source", source)}
	if st != nil {
		attrs = append(attrs, slog.String("method", st.method), slog.String("request_id", st.requestID))
		if st.part != nil {
			attrs = append(attrs, slog.Uint64("partition", st.info.ID))
		}
	}
	if dropped > 0 {
		attrs = append(attrs, slog.Uint64("dropped_before", dropped))
	}
	l.logger.LogAttrs(context.Background(), level, "coproc guest: "+msg, attrs...)
}

// guestWriter is an instance's stdout or stderr: it cuts lines and logs
// each through the module's limiter. stderr also keeps the current call's
// last lines, to explain a trap (a Go guest prints its panic there before
// it exits), and notices the Go runtime's out-of-memory message.
type guestWriter struct {
	in     *instance
	stream string
	line   []byte
	recent []byte // the call's first stderr bytes, at most maxHead
}

// maxHead bounds the stderr kept to explain a failed call: a Go guest's
// panic or fatal error message comes first, the goroutine dump after it.
const maxHead = 300

func (w *guestWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.stream == "stderr" {
		if room := maxHead - len(w.recent); room > 0 {
			w.recent = append(w.recent, p[:min(room, len(p))]...)
		}
		if st := w.in.cur; st != nil && bytes.Contains(p, []byte("out of memory")) {
			st.oom = true
		}
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(w.line) < maxLogLine {
				w.line = append(w.line, p[:min(len(p), maxLogLine-len(w.line))]...)
			}
			break
		}
		if len(w.line) < maxLogLine {
			w.line = append(w.line, p[:min(i, maxLogLine-len(w.line))]...)
		}
		w.emit()
		p = p[i+1:]
	}
	return n, nil
}

func (w *guestWriter) emit() {
	level := slog.LevelInfo
	if w.stream == "stderr" {
		level = slog.LevelWarn
	}
	w.in.m.logs.log(level, w.stream, w.in.cur, string(w.line))
	w.line = w.line[:0]
}

func (w *guestWriter) flush() {
	if len(w.line) > 0 {
		w.emit()
	}
	w.recent = w.recent[:0]
}

// tail returns the call's first stderr bytes on one line.
func (w *guestWriter) tail() string {
	s := strings.TrimSpace(string(w.recent))
	s = strings.ReplaceAll(s, "\n", " | ")
	return s
}
