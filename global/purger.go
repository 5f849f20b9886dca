package global

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// purgeReq asks the purger to remove subject's messages below a sequence:
// an online that a later offline of the same user superseded.
type purgeReq struct {
	subject string
	below   uint64
}

// queuePurge asks the purger to remove a superseded online message.
func (a *Aggregator) queuePurge(p purgeReq) {
	select {
	case a.purgeCh <- p:
	default:
		a.stats.PurgeErrors.Add(1) // the next reload finds it again
	}
}

// purger removes the superseded online messages queued to it, off the
// engine's goroutine. A purge that keeps failing is counted and left:
// the next re-read of the stream finds the message again.
func (a *Aggregator) purger(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.purgeCh:
			var err error
			for i := range purgeRetries {
				pctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
				err = a.stream.Purge(pctx, jetstream.WithPurgeSubject(p.subject), jetstream.WithPurgeSequence(p.below))
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(time.Duration(i+1) * 100 * time.Millisecond)
			}
			if err != nil {
				a.stats.PurgeErrors.Add(1)
			} else {
				a.stats.Purges.Add(1)
			}
		}
	}
}
