// What the token routes need from a provider template, so that the routes run in unit tests
// against children of a test's making; `ProviderTemplate` is the broker's.
import TokenBrokerCore

/// A provider template as the token routes see it: its settings (`perRequest`, allow-lists),
/// and the child for a request's checked values, with the answers rendered for that child.
///
/// - Important: the token routes call `child(for:)` on a server thread: it must not block.
public protocol TemplateProviding<Provider>: TemplateStatusReporting {
    /// The children's type.
    associatedtype Provider: TokenProviding

    /// The template's settings, as configured.
    var configuration: ProviderConfiguration { get }
    /// The child for `values`, made on first use; counts as a read of it. Refused past
    /// `maxChildren` and once stopped.
    func child(for values: TokenRequestValues) -> Result<
        (child: Provider, attachment: TokenResponseCache<Provider.Instant>), ChildRefusal
    >
}

/// The broker's template, whose attachment per child is the cache of its rendered answers,
/// kept as an object (`ChildAttachment`) so that the template's lookup runs specialised.
///
/// - Important: make such a template with `attach` returning the child's `TokenResponseCache`.
extension ProviderTemplate: TemplateProviding where Child: TokenProviding, Attachment == ChildAttachment {
    public typealias Provider = Child

    @_specialize(where Child == TokenProvider<ContinuousClock>, C == ContinuousClock)
    public func child(for values: TokenRequestValues) -> Result<
        (child: Provider, attachment: TokenResponseCache<Provider.Instant>), ChildRefusal
    > {
        let found: Result<(child: Child, attachment: ChildAttachment), ChildRefusal> = child(for: values)
        // The attachment is the cache `attach` made for this child: no check needed at run time.
        return found.map { ($0.child, unsafeDowncast($0.attachment, to: TokenResponseCache<Provider.Instant>.self)) }
    }
}
