package stream

import "time"

// keepaliveLoop tells every secondary in the ack set of an open extent
// this node is primary of the commit point at least every
// CommitKeepalive, also when nothing is written: a secondary then knows
// how stale it may be (Extent.CommitHeard), and an idle partition's
// secondary that heard nothing for longer knows it is cut off. Each tick
// only marks the secondaries the link has sent nothing to for half the
// interval; under writes the data carries the commit point and nothing
// extra is sent.
func (n *Node) keepaliveLoop() {
	defer n.wg.Done()
	t := time.NewTicker(CommitKeepalive / 2)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		as := make([]*appender, 0, len(n.appenders))
		for _, a := range n.appenders {
			as = append(as, a)
		}
		n.mu.Unlock()
		now := time.Now()
		for _, a := range as {
			if info := a.ext.Info(); info.Sealed || info.Frozen || info.Broken {
				continue
			}
			a.mu.Lock()
			for _, s := range a.secs {
				if s.failed == nil && now.Sub(s.lastSent) >= CommitKeepalive/2 {
					s.keepalive = true
					a.kickLocked(s)
				}
			}
			a.mu.Unlock()
		}
	}
}
