// Package linearize records the history of concurrent clients of a
// key-value store and checks it for linearizability with porcupine
// (github.com/anishathalye/porcupine).
//
// The model is a map of independent registers, one per key, with the
// operations of Tabula's point API: Get, Put, Delete (reporting whether the
// key existed) and CompareAndSwap (expect absent or an exact value; swap in a
// value or a delete; report swapped, existed and the current value). Keys
// are independent, so the history is partitioned by key and each key is
// checked on its own (porcupine's Model.Partition), which keeps the search
// small.
//
// # Recording
//
// Each client calls Begin before it sends a request and ends the returned
// Call with exactly one of
//
//	Ok(out)   the reply was received: out is what it said
//	Unknown() the outcome is not known (a timeout, a broken connection after
//	          the request may have been applied): recorded as never
//	          returning, so the checker may place it anywhere after its call
//	          or nowhere at all (after every other operation)
//	Fail()    the request certainly took no effect (refused before it was
//	          sent, or refused for its content): dropped from the history
//
// or with Finish(out, err), which picks one of the three by err through
// the Recorder's Classify function (default Definite, which knows Tabula's
// error codes). A failed Get is always dropped: a read that returned nothing
// constrains nothing.
//
// Times are monotonic nanoseconds since the Recorder was made, taken at
// Begin and at the end, so an operation's interval covers every attempt the
// client made.
//
//	rec := linearize.NewRecorder()
//	call := rec.Begin(client, linearize.Input{Kind: linearize.Put, Key: "k", Value: "v1"})
//	err := tbl.Put(ctx, []byte("k"), []byte("v1"))
//	call.Finish(linearize.Output{}, err)
//	...
//	res := rec.Check(time.Minute)
//	if res.Verdict == porcupine.Illegal {
//		t.Log(res.Report(40))           // the failing keys' histories as text
//		err := res.Visualize(path)      // porcupine's HTML view
//	}
//
// Call.Tag labels an operation; CheckWith re-checks with chosen answered
// writes taken as of unknown outcome, to tell a violation a known client
// behaviour explains from any other.
//
// # Concurrency
//
// A Recorder is safe for concurrent use by any number of clients; a Call
// belongs to the client that began it and is ended once. Check may run while
// clients still record: it checks the operations ended before it.
// The model's functions are pure.
package linearize
