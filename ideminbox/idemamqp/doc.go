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
// requeue for a failed one, Reject without requeue for one that cannot be
// keyed. RabbitMQ cannot requeue with a delay: the consumer holds the
// delivery for the decision's delay, then requeues it. A delivery the
// inbox answers Hold (the store down, the key in flight elsewhere) stays
// unsettled and is processed again, so that it is not counted again.
//
// # Counting deliveries
//
// Quorum queues count deliveries in the x-delivery-count header; the
// inbox reads it, so a poison message is recognised after MaxAttempts
// attempts whatever instance they went to, and even when a consumer
// crashes on it each time. Classic queues only say "redelivered": the
// inbox then counts failures in memory per process, so a poison message
// takes MaxAttempts deliveries per competing instance, and a consumer that
// crashes on it starts over, forever. Prefer quorum queues.
//
// # Delivery limits
//
// A quorum queue with a delivery limit (the x-delivery-limit argument, or
// a delivery-limit policy; RabbitMQ 4 sets 20 when neither does) drops a
// message past it, or dead-letters it, without the inbox knowing: a
// message neither processed nor recorded as poison. RabbitMQ counts every
// delivery given back, a closed channel's included, and the inbox needs
// more than MaxAttempts of them: two to end a crash loop, and one for each
// time a consumer stops, crashes or loses its channel while it holds the
// message (during a store outage, say). Declare quorum queues with
// x-delivery-limit -1 (no limit; the inbox records poison messages
// itself), or at least the inbox's MinDeliveryLimit (MaxAttempts + 12),
// and check the arguments you declare with Consumer.CheckQueueArgs:
// RabbitMQ tells no client the arguments or policies of an existing queue,
// so the consumer cannot check the queue it consumes. Keep policies to
// the same bound.
//
// # Slow handlers and long outages
//
// RabbitMQ gives each delivery a limited time to be acknowledged
// (consumer_timeout, 30 minutes by default; per queue with the
// x-consumer-timeout argument or a consumer-timeout policy since 3.11.15).
// Past it the broker takes the delivery back (closing the channel, or on
// recent versions cancelling the consumer), counts one more delivery, and
// may deliver it again while the first handler still runs. This bounds
// how long a delivery can be held: a handler slower than the timeout, or
// a store outage longer than it, costs one delivery to every message the
// channel holds, and Consume returns ErrClosed. Nothing is doubled: a copy
// delivered while the first handler runs finds the key in flight and is
// held until the first handler commits; then it is acknowledged as a
// duplicate, and the first handler's commit stands even though its own ack
// can no longer reach the broker. Set the timeout above the slowest
// handler and the longest store outage you mean to ride out. (No test
// waits out a consumer timeout, which the broker checks only about once a
// minute.)
package idemamqp
