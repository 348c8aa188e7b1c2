import TokenBrokerServer

/// Answers proxy mode still takes by name; every answer is worded in `ErrorAnswer`.
public enum Responses {
    /// The answer to requests still waiting when the broker stops (`ErrorAnswer.shuttingDown`).
    public static var shuttingDown: HTTPResponse { ErrorAnswer.shuttingDown.response }
}
