package raftnode

import (
	"context"
	"fmt"
	"log/slog"
)

// raftLogger adapts raft's logger to slog. Raft's Info lines (elections,
// votes) go out at Debug: a member logs its own role changes through
// LeaderChange, once, at Info.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) log(level slog.Level, msg string) {
	r.l.Log(context.Background(), level, "raft: "+msg)
}

func (r raftLogger) Debug(v ...any)              { r.log(slog.LevelDebug-4, fmt.Sprint(v...)) }
func (r raftLogger) Debugf(f string, v ...any)   { r.log(slog.LevelDebug-4, fmt.Sprintf(f, v...)) }
func (r raftLogger) Info(v ...any)               { r.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (r raftLogger) Infof(f string, v ...any)    { r.log(slog.LevelDebug, fmt.Sprintf(f, v...)) }
func (r raftLogger) Warning(v ...any)            { r.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) { r.log(slog.LevelWarn, fmt.Sprintf(f, v...)) }
func (r raftLogger) Error(v ...any)              { r.log(slog.LevelError, fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any)   { r.log(slog.LevelError, fmt.Sprintf(f, v...)) }
func (r raftLogger) Fatal(v ...any)              { r.Panic(v...) }
func (r raftLogger) Fatalf(f string, v ...any)   { r.Panicf(f, v...) }
func (r raftLogger) Panic(v ...any)              { s := fmt.Sprint(v...); r.log(slog.LevelError, s); panic(s) }
func (r raftLogger) Panicf(f string, v ...any) {
	s := fmt.Sprintf(f, v...)
	r.log(slog.LevelError, s)
	panic(s)
}
