// What the token routes need from a provider template, so that the routes run in unit tests
// against children of a test's making; `ProviderTemplate` is the broker's.
import TokenBrokerCore

/// A provider template as the token routes see it: its settings (`perRequest`, allow-lists),
/// and the lease of the child for a request's checked values, with the child and its attachment,
/// the cache of the answers rendered for that child.
///
/// - Important: the token routes call `child(for:)` and `renew(_:)` on a server thread: they must not block.
public protocol TemplateProviding<Provider>: TemplateStatusReporting {
    /// The children's type.
    associatedtype Provider: TokenProviding

    /// The template's settings, as configured.
    var configuration: ProviderConfiguration { get }
    /// The lease of the child for `values`, made on first use, and the child; counts as a read
    /// of it. Refused past `maxChildren` and once stopped. The attachment is the child's
    /// `TokenResponseCache`.
    func child(for values: TokenRequestValues) -> Result<
        (lease: TemplateLease<Provider>, held: LeasedChild<Provider>), ChildRefusal
    >
    /// Reads the child of `lease`, one of this template's, again; nil once it was dropped or
    /// the template stopped (then ask `child(for:)`).
    func renew(_ lease: TemplateLease<Provider>) -> LeasedChild<Provider>?
}

/// The lease of a template's child the token routes read, with its rendered answers as its attachment.
public typealias TemplateLease<Provider: TokenProviding> = ChildLease<Provider, ChildAttachment, Provider.Instant>

/// A template's child as a read of its lease gives it, with its rendered answers.
public typealias LeasedChild<Provider: TokenProviding> = TemplateLease<Provider>.Held

extension ChildLease.Held where Child: TokenProviding, Attachment == ChildAttachment, Instant == Child.Instant {
    /// The child's rendered answers: the attachment, which `TemplateProviding` says is its cache.
    var cache: TokenResponseCache<Child.Instant> {
        unsafeDowncast(attachment, to: TokenResponseCache<Child.Instant>.self)
    }
}

/// The broker's template, whose attachment per child is the cache of its rendered answers,
/// kept as an object (`ChildAttachment`) so that the template's lookup runs specialised.
///
/// - Important: make such a template with `attach` returning the child's `TokenResponseCache`.
extension ProviderTemplate: TemplateProviding
where Child: TokenProviding, Attachment == ChildAttachment, C.Instant == Child.Instant {
    public typealias Provider = Child
}
