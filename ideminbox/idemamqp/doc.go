// Package idemamqp connects ideminbox to RabbitMQ consumers
// (github.com/rabbitmq/amqp091-go).
//
// The key of a message is its MessageId property. A delivery without one
// is refused with ideminbox.ErrNoMessageID and rejected without requeue
// (to the queue's dead-letter exchange, if it has one), never processed
// unprotected; Config.KeyFunc may derive the key from something else.
//
// Acknowledgements are manual and follow the inbox's decision, sent after
// the commit: Ack for processed, duplicate and poison messages, Nack with
// requeue for a failed or in-flight one, Reject without requeue for one
// that cannot be keyed. RabbitMQ cannot requeue with a delay: the consumer
// holds the delivery for the decision's delay, then requeues it.
//
// # Counting deliveries
//
// Quorum queues count deliveries in the x-delivery-count header; the
// inbox reads it, so a poison message is recognised after MaxAttempts
// deliveries whatever instance they went to, and even when a consumer
// crashes on it each time. Classic queues only say "redelivered": the
// inbox then counts failures in memory per process, so a poison message
// takes MaxAttempts deliveries per competing instance, and a consumer that
// crashes on it starts over. Prefer quorum queues. On RabbitMQ 4, whose
// quorum queues have a default delivery limit of 20, keep MaxAttempts
// below the queue's limit so that the inbox, not the broker, decides, and
// Inbox.InFlightDeliveries below it too (19 with the defaults: deliveries
// answered "in flight" while a crashed holder's lease runs count as well),
// or raise the limit; the adapter cannot read a queue's arguments to
// check.
//
// # Slow handlers
//
// RabbitMQ gives each delivery a limited time to be acknowledged
// (consumer_timeout, 30 minutes by default; per queue with the
// x-consumer-timeout argument or a consumer-timeout policy since 3.11.15).
// Past it the broker takes the delivery back (closing the channel, or on
// recent versions cancelling the consumer) and may deliver it again while
// the first handler still runs. Nothing is doubled: the copy finds the key
// in flight and is requeued after InFlightDelay, over and over, until the
// first handler commits; then it is acknowledged as a duplicate, and the
// first handler's commit stands even though its own ack can no longer
// reach the broker. But the copies cost work, and Consume returns
// ErrClosed when the channel closes under it. Set the timeout above the
// slowest handler. (The inbox's answers to a copy in flight and to one
// already processed are tested; no test waits out a consumer timeout,
// which the broker checks only about once a minute.)
package idemamqp
