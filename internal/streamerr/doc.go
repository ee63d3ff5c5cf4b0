// Package streamerr maps the stream manager's errors (replication/stream
// sentinels) to Tabula API statuses and back, so the master's stream
// service and the client's stream.ManagerClient agree: a client sees
// errors.Is(err, stream.ErrFenced) for a fence the master reported.
package streamerr
