package hooks

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// arrival is a signal and when stasis run received it.
type arrival struct {
	sig syscall.Signal
	at  time.Time
}

// signalQueue reads stasis run's signals from the moment it is made, also
// while the job is starting and nothing else looks: each is kept, with its
// arrival time, until the loop takes it. SIGCHLD, which only says "look at
// the children" and may come in floods (a hook's short-lived children),
// has a channel of one slot of its own, so that it cannot crowd out the
// signals that matter.
type signalQueue struct {
	raw, chld chan os.Signal
	wake      chan struct{} // one slot: something is pending
	done      chan struct{}
	mu        sync.Mutex
	pending   []arrival
}

func listenSignals(sigs []syscall.Signal) *signalQueue {
	q := &signalQueue{raw: make(chan os.Signal, 32), chld: make(chan os.Signal, 1), wake: make(chan struct{}, 1), done: make(chan struct{})}
	var notify []os.Signal
	for _, sig := range sigs {
		notify = append(notify, sig)
	}
	signal.Notify(q.chld, syscall.SIGCHLD)
	signal.Notify(q.raw, notify...)
	go func() {
		for {
			select {
			case sig := <-q.raw:
				q.mu.Lock()
				q.pending = append(q.pending, arrival{sig: sig.(syscall.Signal), at: time.Now()})
				q.mu.Unlock()
				select {
				case q.wake <- struct{}{}:
				default:
				}
			case <-q.done:
				return
			}
		}
	}()
	return q
}

// take returns the signals received since the last take, oldest first.
func (q *signalQueue) take() []arrival {
	q.mu.Lock()
	defer q.mu.Unlock()
	got := q.pending
	q.pending = nil
	return got
}

func (q *signalQueue) stop() {
	signal.Stop(q.raw)
	signal.Stop(q.chld)
	close(q.done)
}
