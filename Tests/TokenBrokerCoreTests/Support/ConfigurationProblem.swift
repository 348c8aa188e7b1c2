import TokenBrokerCore

/// What reading `json` as the broker's configuration says is wrong with it; nil when it is accepted.
func configurationProblem(_ json: String) -> String? {
    do {
        _ = try BrokerConfiguration(json: Array(json.utf8))
        return nil
    } catch {
        return error.description
    }
}
