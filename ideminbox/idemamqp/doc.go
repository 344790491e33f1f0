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
// below the queue's limit so that the inbox, not the broker, decides.
package idemamqp
